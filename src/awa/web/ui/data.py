"""What the web UI shows, read with bounded queries (see ``db/sql/ui.sql``).

Every function takes a connection and the bound `Queries` and returns plain
JSON-ready dicts. Counts are capped (``COUNT_CAP``) and lists read a bounded
window of ids, so a page costs the same with a thousand or a million jobs.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from awa.admin import descriptors as awa_descriptors
from awa.admin import jobs as admin_jobs
from awa.admin.workflows import workflow_graph
from awa.core import validate
from awa.core.model import Job
from awa.core.states import ERROR_TEXT_MAX, TERMINAL, JobState
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.worker import overrides
from awa.worker.presence import PRESENCE_INTERVAL, STALE_AFTER_INTERVALS

#: Counts stop here and show as "100,000+".
COUNT_CAP = 100_000
#: Rows a jobs page reads at most before filtering (the rest is one click away).
SCAN_WINDOW = 5_000
PAGE_SIZE = 50
#: Longest args preview in lists.
PREVIEW_CHARS = 160
MAX_CURSOR = 2**63 - 1


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


async def overview(conn: Conn, q: Queries, minutes: int = 60) -> dict[str, Any]:
    """Dashboard: counts by state, per-minute series and recent failures."""
    counts = dict(await conn.fetchrow(q["ui_state_counts"], COUNT_CAP) or {})
    rows = {r["minute"]: r for r in await conn.fetch(q["ui_series"], minutes, None)}
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    series = []
    for minute in (now - timedelta(minutes=i) for i in range(minutes - 1, -1, -1)):
        r = rows.get(minute)
        waits = r["wait_count"] if r else 0
        series.append({"minute": _iso(minute), "completed": r["completed"] if r else 0,
                       "failed": r["failed"] if r else 0,
                       "wait_ms_avg": r["wait_ms_sum"] / waits if r and waits else None,
                       "wait_ms_max": r["wait_ms_max"] if r and waits else None})
    failures = [{"id": r["id"], "kind": r["kind"], "queue": r["queue"], "attempt": r["attempt"],
                 "max_attempts": r["max_attempts"], "finalized_at": _iso(r["finalized_at"]),
                 "error": (r["last_error"] or {}).get("error", "")[:300]}
                for r in await conn.fetch(q["ui_recent_failures"], 10)]
    return {"counts": counts, "count_cap": COUNT_CAP, "series": series,
            "recent_failures": failures, "queues": await queues(conn, q)}


async def queues(conn: Conn, q: Queries) -> list[dict[str, Any]]:
    """Every known queue with depth, lag, rate, pause state, overrides and descriptor."""
    described = {d["name"]: d for d in await descriptors(conn, q) if d["scope"] == "queue"}
    ovs = {r["queue"]: overrides.describe(r) for r in await conn.fetch(q["override_list"], None)}
    names = [r["queue"] for r in await conn.fetch(q["ui_queue_names"])]
    names += sorted(set(described) - set(names))
    out = []
    for name in names:
        row = dict(await conn.fetchrow(q["ui_queue_detail"], name, COUNT_CAP) or {})
        row["override"] = ovs.get(name)
        row["descriptor"] = described.get(name)
        out.append(row)
    return out


async def concurrency_keys(conn: Conn, q: Queries) -> list[dict[str, Any]]:
    """Concurrency keys with jobs in flight, saturated first (`client.concurrency_keys`)."""
    return [dataclasses.asdict(k) for k in await admin_jobs.concurrency_keys(conn, q)]


async def descriptors(conn: Conn, q: Queries) -> list[dict[str, Any]]:
    """Declared queue and kind descriptors with live / stale / drifted status."""
    return await awa_descriptors.read(conn, q)


def _preview(job: Job) -> dict[str, Any]:
    args = json.dumps(job.args, separators=(",", ":"))
    return {"id": job.id, "kind": job.kind, "queue": job.queue, "state": str(job.state),
            "priority": job.priority, "attempt": job.attempt,
            "max_attempts": job.max_attempts, "tags": job.tags,
            "run_at": _iso(job.run_at_datetime), "created_at": _iso(job.created_at_datetime),
            "finalized_at": _iso(job.finalized_at_datetime),
            "args_preview": args if len(args) <= PREVIEW_CHARS else args[:PREVIEW_CHARS] + "…"}


def _opt(field: str, value: str | None) -> str | None:
    value = (value or "").strip()
    return validate.check_name(field, value) if value else None


async def jobs_page(conn: Conn, q: Queries, *, state: str | None = None,
                    queue: str | None = None, kind: str | None = None, tag: str | None = None,
                    search: str | None = None, cursor: int | None = None) -> dict[str, Any]:
    """A page of jobs, newest first. ``next_cursor`` continues below this page
    (also when the scan window ran out before the page filled)."""
    parsed = JobState.parse(state) if state else None
    name = ("ui_jobs_all" if parsed is None
            else "ui_jobs_done" if parsed in TERMINAL else "ui_jobs_active")
    search = validate.check_text("q", (search or "").strip()[:200]) or None
    below = validate.check_int("cursor", cursor, 1, MAX_CURSOR) if cursor else MAX_CURSOR
    rows = await conn.fetch(q[name], below, parsed.value if parsed else None,
                            _opt("queue", queue), _opt("kind", kind), _opt("tag", tag),
                            search, PAGE_SIZE, SCAN_WINDOW)
    jobs = [_preview(Job.from_row(r)) for r in rows]
    next_cursor: int | None = None
    if len(rows) == PAGE_SIZE:
        next_cursor = rows[-1]["id"]
    elif rows and rows[0]["scanned"] == SCAN_WINDOW:
        next_cursor = rows[0]["scanned_to"]
    elif not rows:
        # Nothing matched in this window: offer to look further down if it was full.
        probe = await conn.fetch(q[name], below, parsed.value if parsed else None,
                                 None, None, None, None, 1, SCAN_WINDOW)
        if probe and SCAN_WINDOW <= probe[0]["scanned"]:
            next_cursor = probe[0]["scanned_to"]
    return {"jobs": jobs, "next_cursor": next_cursor, "scan_window": SCAN_WINDOW}


def timeline(job: Job, *, cut: bool = True) -> list[dict[str, Any]]:
    """The job's life as events: created, each attempt's error (cut to
    `ERROR_TEXT_MAX` unless not ``cut``), parked, finished."""
    events: list[dict[str, Any]] = [{"at": _iso(job.created_at_datetime), "event": "created",
                                     "detail": f"queue {job.queue}, priority {job.priority}"}]
    for err in job.errors:
        events.append({"at": err.get("at"), "event": f"attempt {err.get('attempt', '?')} error",
                       "detail": _cut_error(err.get("error", ""))[0] if cut
                       else err.get("error", "")})
    if job.attempted_at is not None:
        events.append({"at": _iso(job.attempted_at), "event": f"attempt {job.attempt} started",
                       "detail": ""})
    if job.state is JobState.WaitingExternal:
        events.append({"at": _iso(job.attempted_at), "event": "waiting for callback",
                       "detail": _callback_label(job)})
    if job.finalized_at_datetime is not None:
        events.append({"at": _iso(job.finalized_at_datetime), "event": str(job.state),
                       "detail": ""})
    return sorted(events, key=lambda e: e["at"] or "")


def _cut_error(text: Any) -> tuple[Any, int]:
    """An attempt's error text cut to `ERROR_TEXT_MAX` (errors stored before that
    cap, or written by hand, can be megabytes), and its full length if cut, else 0."""
    if not isinstance(text, str) or len(text) <= ERROR_TEXT_MAX:
        return text, 0
    return text[:ERROR_TEXT_MAX - 1] + "…", len(text)


def _callback_label(job: Job) -> str | None:
    """'waiting for callback #N' for a parked job (N counts the job's callbacks)."""
    if job.callback_id is None:
        return None
    n = job.metadata.get("awa:callback_seq")
    number = f" #{n}" if isinstance(n, int) else ""
    verb = "waiting for" if job.state is JobState.WaitingExternal else "registered"
    return f"{verb} callback{number} ({job.callback_id})"


#: A job page shows each large value (args, metadata, output, progress) up to this
#: many bytes of JSON; ``?full=1`` sends it whole.
DETAIL_VALUE_MAX = 64 * 1024
LARGE_FIELDS = ("args", "metadata", "output", "progress")


def job_detail(job: Job, dlq: dict[str, Any] | None, *, full: bool = False) -> dict[str, Any]:
    """Everything the job page shows; values over `DETAIL_VALUE_MAX` cut to a text
    preview, their full size in ``truncated`` (unless ``full``), and so each
    error text over `ERROR_TEXT_MAX` (``truncated["errors"]``: the longest)."""
    out = job.to_dict()
    truncated: dict[str, int] = {}
    if not full:
        errors = []
        for err in out["errors"] or []:
            text, size = _cut_error(err.get("error") if isinstance(err, dict) else None)
            if size:
                truncated["errors"] = max(truncated.get("errors", 0), size)
                err = {**err, "error": text}
            errors.append(err)
        out["errors"] = errors
        for name in LARGE_FIELDS:
            text = json.dumps(out[name], ensure_ascii=False, separators=(",", ":"))
            size = len(text.encode())
            if size > DETAIL_VALUE_MAX:
                truncated[name] = size
                out[name] = text[:DETAIL_VALUE_MAX // 4] + "…"
    return {"job": out, "timeline": timeline(job, cut=not full), "callback": _callback_label(job),
            "dlq": dlq, "truncated": truncated}


def cron_jobs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Schedules with times as ISO strings."""
    return [{k: _iso(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in rows]


async def runtime(conn: Conn, q: Queries) -> dict[str, Any]:
    """Live worker processes and the maintenance leader."""
    stale_after = PRESENCE_INTERVAL.total_seconds() * STALE_AFTER_INTERVALS
    workers = []
    for r in await conn.fetch(q["ui_runtime"]):
        w = {k: _iso(v) if isinstance(v, datetime) else v for k, v in dict(r).items()}
        w["stale"] = r["seen_seconds_ago"] > stale_after
        workers.append(w)
    leader = await conn.fetchrow(q["ui_leader"])
    return {"workers": workers,
            "leader": None if leader is None else {
                "holder": leader["holder"], "expires_at": _iso(leader["expires_at"]),
                "live": leader["live"]}}



async def workflow(conn: Conn, q: Queries, job_id: int) -> dict[str, Any]:
    """The dependency graph around a job, by layer (a job's layer is one more
    than its deepest parent's), for the job page; one node when it has none."""
    graph = await workflow_graph(conn, q, job_id)
    return {**graph.as_dict(), "layers": [[n.id for n in layer] for layer in graph.layers()]}
