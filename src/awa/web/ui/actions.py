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

from awa.errors import JobNotFound, ValidationError
from awa.web.ui import data

if TYPE_CHECKING:
    from awa.web.ui.app import UiState

Handler = Callable[[Request], Awaitable[Response]]


def _int(request: Request, name: str) -> int:
    raw = request.path_params.get(name) or request.query_params.get(name) or ""
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(name, "must be an integer") from None


async def _body(request: Request) -> dict[str, Any]:
    if not await request.body():
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise ValidationError("body", "must be JSON") from None
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
        return JSONResponse(data.job_detail(found, dlq))

    async def queues(_: Request) -> Response:
        client = await state.client()
        async with state.reading() as conn:
            kinds = [d for d in await data.descriptors(conn, client._q) if d["scope"] == "kind"]
            return JSONResponse({"queues": await data.queues(conn, client._q), "kinds": kinds})

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

    reads: list[tuple[str, Handler]] = [
        ("/api/overview", overview), ("/api/jobs", jobs), ("/api/jobs/{id}", job),
        ("/api/queues", queues), ("/api/cron", cron), ("/api/dlq", dlq),
        ("/api/runtime", runtime)]
    writes: list[tuple[str, Handler]] = [
        ("/api/jobs/retry-failed", retry_failed),
        ("/api/jobs/{id:int}/retry", job_retry), ("/api/jobs/{id:int}/cancel", job_cancel),
        *((f"/api/queues/{{name}}/{v}", queue_action(v)) for v in ("pause", "resume", "drain")),
        ("/api/queues/{name}/overrides", override_set),
        ("/api/queues/{name}/overrides/clear", override_clear),
        *((f"/api/cron/{{name}}/{v}", cron_action(v)) for v in ("pause", "resume", "trigger")),
        ("/api/dlq/retry", dlq_retry_bulk), ("/api/dlq/purge", dlq_purge),
        ("/api/dlq/{id:int}/retry", dlq_retry), ("/api/dlq/{id:int}/purge", dlq_purge_one)]
    return reads, writes
