"""The UI's JSON API: one small handler per read or action.

`routes` returns ``(reads, writes)`` as ``(path, handler)`` lists; `app`
wraps them with auth, read-only and error handling. Writes go through the
client's admin methods, so the UI does exactly what the CLI and API do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import awa.web.ui.data as data
from awa.admin import batch
from awa.core.errors import JobNotFound, ValidationError
from awa.core.serialize import loads

if TYPE_CHECKING:
    from awa.web.ui.state import UiState

Handler = Callable[[Request], Awaitable[Response]]


#: What ``POST api/queues/{name}/overrides`` may set (``updated_by`` is the UI's own).
OVERRIDE_KEYS = frozenset({"poll_interval_ms", "claim_batch_size", "rate_limit", "deadline_ms"})


def _int(request: Request, name: str) -> int:
    raw = request.path_params.get(name) or request.query_params.get(name) or ""
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(name, "must be an integer") from None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    body = loads(raw, "body")
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    return body


def _filters(source: Any) -> dict[str, str | None]:
    """kind / queue / tag from query params or a body; blanks mean 'any'."""
    out: dict[str, str | None] = {}
    for key in ("kind", "queue", "tag"):
        value = source.get(key)
        if value is not None and not isinstance(value, str):
            raise ValidationError(key, "must be a string")
        out[key] = value.strip() if value and value.strip() else None
    return out


_BATCH_FILTERS = {"queue": "queue", "kind": "kind", "tag": "tag", "state": "state",
                  "created_after": "created_at_gte", "created_before": "created_at_lt"}


def _batch_request(source: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(op_kind, spec, filter)`` from the flat fields of a query or body; blanks are unset."""
    def value(key: str) -> Any:
        v = source.get(key)
        return v.strip() or None if isinstance(v, str) else v

    def number(key: str) -> Any:
        v = value(key)
        try:
            return int(v) if isinstance(v, str) else v
        except ValueError:
            raise ValidationError(key, "must be an integer") from None
    op_kind = value("op_kind") or ""
    spec: dict[str, Any] = {"priority": number("priority")}
    if op_kind == "move_queue":
        spec["queue"] = value("target_queue")
        if spec["priority"] is None:
            del spec["priority"]
    ids = value("ids")
    if isinstance(ids, str):
        try:
            ids = [int(i) for i in ids.replace(",", " ").split()]
        except ValueError:
            raise ValidationError("ids", "must be job ids separated by commas") from None
    f = {name: value(key) for key, name in _BATCH_FILTERS.items()}
    f["ids"] = ids
    return op_kind, spec, {k: v for k, v in f.items() if v is not None}


def routes(state: UiState) -> tuple[list[tuple[str, Handler]], list[tuple[str, Handler]]]:
    """Every API endpoint, bound to ``state``."""

    async def overview(_: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            return JSONResponse(await data.overview(conn, client._q))

    async def jobs(request: Request) -> Response:
        p = request.query_params
        client = await state.client()
        async with state.reading() as conn:
            page = await data.jobs_page(
                conn, client._q, state=p.get("state") or None, search=p.get("q"),
                cursor=_int(request, "cursor") if p.get("cursor") else None, **_filters(p))
        return JSONResponse(page)

    async def job(request: Request) -> Response:
        client = await state.client()
        job_id = _int(request, "id")
        found = await client.get_job(job_id)
        entry = await client.get_dlq_job(job_id)
        dlq = None if entry is None else {"reason": entry.reason,
                                          "dlq_at": entry.dlq_at.isoformat()}
        full = request.query_params.get("full") in ("1", "true")
        return JSONResponse(data.job_detail(found, dlq, full=full))

    async def job_workflow(request: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            return JSONResponse(await data.workflow(conn, client._q, _int(request, "id")))

    async def queues(_: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            kinds = [d for d in await data.descriptors(conn, client._q) if d["scope"] == "kind"]
            return JSONResponse({"queues": await data.queues(conn, client._q), "kinds": kinds,
                                 "keys": await data.concurrency_keys(conn, client._q)})

    async def cron(_: Request) -> Response:
        client = await state.client()
        return JSONResponse({"cron": data.cron_jobs(await client.list_cron_jobs())})

    async def dlq(request: Request) -> Response:
        client = await state.client()
        p = request.query_params
        f = _filters(p)
        entries = await client.list_dlq(
            kind=f["kind"], queue=f["queue"], tag=f["tag"], limit=data.PAGE_SIZE,
            before_id=_int(request, "cursor") if p.get("cursor") else None)
        rows = [{**data._preview(e.job), "reason": e.reason, "dlq_at": e.dlq_at.isoformat()}
                for e in entries]
        more = len(rows) == data.PAGE_SIZE
        return JSONResponse({"jobs": rows, "next_cursor": rows[-1]["id"] if more else None})

    async def batches(_: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            ops = await batch.list_operations(conn, client._q, limit=data.PAGE_SIZE)
        return JSONResponse({"operations": ops})

    async def batch_one(request: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            op = await batch.get_operation(conn, client._q, request.path_params["id"])
        return JSONResponse(op)

    async def batch_preview(request: Request) -> Response:
        op_kind, spec, f = _batch_request(request.query_params)
        client = await state.client()
        async with state.reading() as conn:
            found = await batch.preview(conn, client._q, op_kind, spec, f)
        keys = ("id", "kind", "queue", "state", "priority", "run_at", "created_at", "tags")
        return JSONResponse({"total_matched": found["total_matched"],
                             "sample": [{k: j[k] for k in keys} for j in found["sample"]]})

    async def runtime(_: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            return JSONResponse(await data.runtime(conn, client._q))

    # -- actions ----------------------------------------------------------------------

    async def job_retry(request: Request) -> Response:
        job = await (await state.client()).retry(_int(request, "id"))
        return JSONResponse({"ok": True, "state": str(job.state)})

    async def job_cancel(request: Request) -> Response:
        job = await (await state.client()).cancel(_int(request, "id"))
        return JSONResponse({"ok": job is not None})

    async def retry_failed(request: Request) -> Response:
        f = _filters(await _body(request))
        result = await (await state.client()).retry_failed(kind=f["kind"], queue=f["queue"])
        return JSONResponse({"ok": True, "retried": len(result.jobs)})

    def queue_action(verb: str) -> Handler:
        async def act(request: Request) -> Response:
            client, name = await state.client(), request.path_params["name"]
            if verb == "pause":
                await client.pause_queue(name, paused_by="web-ui")
                return JSONResponse({"ok": True})
            if verb == "resume":
                await client.resume_queue(name)
                return JSONResponse({"ok": True})
            return JSONResponse({"ok": True, "drained": await client.drain_queue(name)})
        return act

    async def override_set(request: Request) -> Response:
        body = await _body(request)
        unknown = sorted(set(body) - OVERRIDE_KEYS)
        if unknown:
            raise ValidationError("body", f"unknown key(s) {unknown}; expected some of "
                                          f"{sorted(OVERRIDE_KEYS)}")
        row = await (await state.client()).set_queue_override(
            request.path_params["name"], updated_by="web-ui",
            **{k: (v if v != "" else None) for k, v in body.items()})
        return JSONResponse({"ok": True, "override": row})

    async def override_clear(request: Request) -> Response:
        found = await (await state.client()).clear_queue_override(request.path_params["name"])
        return JSONResponse({"ok": found})

    def cron_action(verb: str) -> Handler:
        async def act(request: Request) -> Response:
            client, name = await state.client(), request.path_params["name"]
            if verb == "trigger":
                job = await client.trigger_cron_job(name)
                return JSONResponse({"ok": True, "job_id": job.id})
            done = await (client.pause_cron_job(name) if verb == "pause"
                          else client.resume_cron_job(name))
            if not done:
                raise JobNotFound(f"no cron schedule named {name!r}")
            return JSONResponse({"ok": True})
        return act

    async def dlq_retry(request: Request) -> Response:
        job = await (await state.client()).retry_from_dlq(_int(request, "id"))
        if job is None:
            raise JobNotFound(f"job {request.path_params['id']} is not in the DLQ")
        return JSONResponse({"ok": True, "job_id": job.id})

    async def dlq_purge_one(request: Request) -> Response:
        if not await (await state.client()).purge_dlq_job(_int(request, "id")):
            raise JobNotFound(f"job {request.path_params['id']} is not in the DLQ")
        return JSONResponse({"ok": True})

    async def dlq_retry_bulk(request: Request) -> Response:
        f = _filters(await _body(request))
        n = await (await state.client()).bulk_retry_from_dlq(kind=f["kind"], queue=f["queue"],
                                                             tag=f["tag"])
        return JSONResponse({"ok": True, "retried": n})

    async def dlq_purge(request: Request) -> Response:
        f = _filters(await _body(request))
        n = await (await state.client()).purge_dlq(kind=f["kind"], queue=f["queue"], tag=f["tag"])
        return JSONResponse({"ok": True, "purged": n})

    async def batch_submit(request: Request) -> Response:
        op_kind, spec, f = _batch_request(await _body(request))
        client = await state.client()
        op = await batch.submit(await client.pool(), client._q, op_kind, spec, f,
                                submitted_by="web-ui")
        return JSONResponse({"ok": True, "operation": op})

    async def batch_cancel(request: Request) -> Response:
        client = await state.client()
        op = await batch.cancel_operation(await client.pool(), client._q,
                                          request.path_params["id"])
        return JSONResponse({"ok": True, "operation": op})

    reads: list[tuple[str, Handler]] = [
        ("/api/overview", overview), ("/api/jobs", jobs), ("/api/jobs/{id}", job),
        ("/api/jobs/{id:int}/workflow", job_workflow),
        ("/api/queues", queues), ("/api/cron", cron), ("/api/dlq", dlq),
        ("/api/runtime", runtime), ("/api/batches", batches),
        ("/api/batches/preview", batch_preview), ("/api/batches/{id}", batch_one)]
    writes: list[tuple[str, Handler]] = [
        ("/api/jobs/retry-failed", retry_failed),
        ("/api/jobs/{id:int}/retry", job_retry), ("/api/jobs/{id:int}/cancel", job_cancel),
        *((f"/api/queues/{{name}}/{v}", queue_action(v)) for v in ("pause", "resume", "drain")),
        ("/api/queues/{name}/overrides", override_set),
        ("/api/queues/{name}/overrides/clear", override_clear),
        *((f"/api/cron/{{name}}/{v}", cron_action(v)) for v in ("pause", "resume", "trigger")),
        ("/api/dlq/retry", dlq_retry_bulk), ("/api/dlq/purge", dlq_purge),
        ("/api/dlq/{id:int}/retry", dlq_retry), ("/api/dlq/{id:int}/purge", dlq_purge_one),
        ("/api/batches", batch_submit), ("/api/batches/{id}/cancel", batch_cancel)]
    return reads, writes
