"""Dead letter queue (docs/guide/dlq.md): where terminal failures of opted-in queues go.

The failure statements themselves route a job here (atomically with the
failure) when its queue is DLQ-enabled; this module is the admin side: list,
inspect, retry, move in, and purge. Bulk operations refuse to run without a
filter unless ``allow_all=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from awa.core import validate
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries, rows_affected

Executor = Conn | asyncpg.Pool


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """A dead-lettered job and why it is here."""

    job: Job
    reason: str
    dlq_at: datetime
    original_run_lease: int

    @classmethod
    def from_row(cls, row: Any) -> DlqEntry:
        return cls(Job.from_row(row), row["reason"], row["dlq_at"], row["original_run_lease"])


def _require_filter(operation: str, allow_all: bool, *filters: Any) -> None:
    if not allow_all and all(f is None for f in filters):
        raise ValidationError("filter", f"{operation} needs at least one of kind, queue or tag "
                              "(or allow_all=True)")


def _opt_name(field: str, value: str | None) -> str | None:
    return validate.check_name(field, value) if value is not None else None


def _opt_text(field: str, value: str | None) -> str | None:
    return validate.check_text(field, value) if value is not None else None


def _opt_id(field: str, value: int | None) -> int | None:
    return validate.check_id(field, value) if value is not None else None


def _check_reason(reason: Any) -> str:
    if not isinstance(reason, str) or not reason:
        raise ValidationError("reason", "must be a non-empty string")
    return validate.check_text("reason", reason)


def _opt_time(field: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValidationError(field, "must be a datetime")
    return validate.as_utc(value, field)


async def list_dlq(db: Executor, q: Queries, *, kind: str | None = None,
                   queue: str | None = None, tag: str | None = None,
                   before_id: int | None = None, before_dlq_at: datetime | None = None,
                   limit: int = 100) -> list[DlqEntry]:
    """Newest first; page with ``before_id`` (the last id of the previous page)."""
    validate.check_int("limit", limit, 1, 10_000)
    with translated():
        rows = await db.fetch(q["dlq_list"], _opt_name("kind", kind), _opt_name("queue", queue),
                              _opt_text("tag", tag), _opt_id("before_id", before_id),
                              _opt_time("before_dlq_at", before_dlq_at), limit)
    return [DlqEntry.from_row(r) for r in rows]


async def get_dlq_job(db: Executor, q: Queries, job_id: int) -> DlqEntry | None:
    validate.check_id("job_id", job_id)
    with translated():
        row = await db.fetchrow(q["dlq_get"], job_id)
    return DlqEntry.from_row(row) if row is not None else None


async def dlq_depth(db: Executor, q: Queries, *, queue: str | None = None) -> int:
    with translated():
        return int(await db.fetchval(q["dlq_depth"], _opt_name("queue", queue)))


async def dlq_depth_by_queue(db: Executor, q: Queries) -> dict[str, int]:
    with translated():
        rows = await db.fetch(q["dlq_depth_by_queue"])
    return {r["queue"]: r["n"] for r in rows}


async def retry_from_dlq(db: Executor, q: Queries, job_id: int, *,
                         run_at: datetime | None = None, priority: int | None = None,
                         queue: str | None = None) -> Job | None:
    """Re-enqueue one dead-lettered job (attempt 0); None if it is not in the DLQ."""
    validate.check_id("job_id", job_id)
    if priority is not None:
        validate.check_int("priority", priority, 1, 4)
    with translated():
        rows = await db.fetch(q["dlq_retry"], job_id, validate.check_run_at(run_at),
                              _opt_name("queue", queue), priority, None, None, None)
    return Job.from_row(rows[0]) if rows else None


async def bulk_retry_from_dlq(db: Executor, q: Queries, *, kind: str | None = None,
                              queue: str | None = None, tag: str | None = None,
                              allow_all: bool = False) -> int:
    _require_filter("bulk_retry_from_dlq", allow_all, kind, queue, tag)
    with translated():
        rows = await db.fetch(q["dlq_retry"], None, None, None, None, _opt_name("kind", kind),
                              _opt_name("queue", queue), _opt_text("tag", tag))
    return len(rows)


async def move_failed_to_dlq(db: Executor, q: Queries, job_id: int,
                             reason: str = "manual") -> DlqEntry | None:
    """Move one failed job into the DLQ; None if it is not a failed job."""
    validate.check_id("job_id", job_id)
    _check_reason(reason)
    with translated():
        rows = await db.fetch(q["dlq_move_failed"], job_id, reason, None, None, None)
    return DlqEntry.from_row(rows[0]) if rows else None


async def bulk_move_failed_to_dlq(db: Executor, q: Queries, *, kind: str | None = None,
                                  queue: str | None = None, tag: str | None = None,
                                  reason: str = "manual", allow_all: bool = False) -> int:
    _require_filter("bulk_move_failed_to_dlq", allow_all, kind, queue, tag)
    with translated():
        rows = await db.fetch(q["dlq_move_failed"], None, _check_reason(reason),
                              _opt_name("kind", kind), _opt_name("queue", queue),
                              _opt_text("tag", tag))
    return len(rows)


async def purge_dlq_job(db: Executor, q: Queries, job_id: int) -> bool:
    validate.check_id("job_id", job_id)
    with translated():
        status = await db.execute(q["dlq_purge"], job_id, None, None, None, None, None)
    return status.endswith(" 1")


async def purge_dlq(db: Executor, q: Queries, *, kind: str | None = None,
                    queue: str | None = None, tag: str | None = None,
                    before_id: int | None = None, before_dlq_at: datetime | None = None,
                    allow_all: bool = False) -> int:
    _require_filter("purge_dlq", allow_all, kind, queue, tag, before_id, before_dlq_at)
    with translated():
        status = await db.execute(q["dlq_purge"], None, _opt_name("kind", kind),
                                  _opt_name("queue", queue), _opt_text("tag", tag),
                                  _opt_id("before_id", before_id),
                                  _opt_time("before_dlq_at", before_dlq_at))
    return rows_affected(status)
