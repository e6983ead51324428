"""Chunked bulk admin actions: count first, then act in short transactions.

The one-statement client methods (``retry_failed``, ``discard_failed``,
``bulk_retry_from_dlq``, ``purge_dlq``) do everything in one transaction,
which holds locks for long on a big backlog and cannot report progress.
Here an action is scoped first (how many rows match, and the highest id), then
run in chunks of at most ``chunk_size`` rows in id order, each its own
statement, advancing past the highest id seen: every matching job is acted on
at most once, even one that fails again while the action is still running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from awa.core import validate
from awa.core.errors import ValidationError
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries

Executor = Conn | asyncpg.Pool
MAX_CHUNK = 100_000


@dataclass(frozen=True, slots=True)
class BulkAction:
    """What to act on: the scope and chunk statements, and their filter parameters."""

    scope_sql: str
    chunk_sql: str
    filters: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Scope:
    """How many rows matched when counted, and the highest id to act on."""

    total: int
    last_id: int | None


def _name(field: str, value: str | None) -> str | None:
    return validate.check_name(field, value) if value is not None else None


def retry_failed(*, kind: str | None = None, queue: str | None = None) -> BulkAction:
    """Failed jobs of one kind or one queue back to available (as `retry_failed`)."""
    if (kind is None) == (queue is None):
        raise ValidationError("kind/queue", "specify exactly one of kind or queue")
    return BulkAction("bulk_failed_scope", "bulk_failed_retry_chunk",
                      (_name("kind", kind), _name("queue", queue)))


def discard_failed(kind: str) -> BulkAction:
    """Delete the failed jobs of ``kind`` (as `discard_failed`)."""
    return BulkAction("bulk_failed_scope", "bulk_failed_discard_chunk",
                      (validate.check_name("kind", kind), None))


def _dlq_filters(operation: str, kind: str | None, queue: str | None, tag: str | None,
                 allow_all: bool) -> tuple[Any, ...]:
    if not allow_all and kind is None and queue is None and tag is None:
        raise ValidationError("filter", f"{operation} needs at least one of kind, queue or "
                              "tag (or allow_all=True)")
    if tag is not None and (not isinstance(tag, str) or "\x00" in tag):
        raise ValidationError("tag", "must be a string")
    return _name("kind", kind), _name("queue", queue), tag


def retry_dlq(*, kind: str | None = None, queue: str | None = None, tag: str | None = None,
              allow_all: bool = False) -> BulkAction:
    """Re-enqueue matching dead-lettered jobs (as `bulk_retry_from_dlq`)."""
    return BulkAction("bulk_dlq_scope", "bulk_dlq_retry_chunk",
                      _dlq_filters("bulk_retry_from_dlq", kind, queue, tag, allow_all))


def purge_dlq(*, kind: str | None = None, queue: str | None = None, tag: str | None = None,
              allow_all: bool = False) -> BulkAction:
    """Delete matching dead-lettered jobs (as `purge_dlq`)."""
    return BulkAction("bulk_dlq_scope", "bulk_dlq_purge_chunk",
                      _dlq_filters("purge_dlq", kind, queue, tag, allow_all))


async def scope(db: Executor, q: Queries, action: BulkAction) -> Scope:
    """Count what ``action`` matches now and fix the highest id it may touch."""
    with translated():
        row = await db.fetchrow(q[action.scope_sql], *action.filters)
    assert row is not None  # an aggregate always answers one row
    return Scope(total=int(row["total"]), last_id=row["last_id"])


async def run(db: Executor, q: Queries, action: BulkAction, within: Scope, *,
              chunk_size: int = 1000,
              on_chunk: Callable[[int], None] | None = None) -> int:
    """Act on ``within`` in chunks (each its own transaction); returns how many rows."""
    validate.check_int("chunk_size", chunk_size, 1, MAX_CHUNK)
    done = 0
    after: int | None = None
    while within.last_id is not None:
        with translated():
            row = await db.fetchrow(q[action.chunk_sql], *action.filters, after,
                                    within.last_id, chunk_size)
        assert row is not None  # the outer SELECT always answers one row
        if row["last_id"] is None:
            break
        after = int(row["last_id"])
        done += int(row["done"])
        if on_chunk is not None:
            on_chunk(int(row["done"]))
    return done
