"""Durable batch operations: submit, preview, list, cancel and purge them.

The operation's shape and validation live in `awa.core.batch_spec`; the
maintenance leader carries submitted operations out (`awa.maintenance.batch`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

import asyncpg

from awa.core import validate
from awa.core.batch_spec import (
    RETENTION,
    SAMPLE_SIZE,
    STATES,
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
    operation_id,
    parse_filter,
    parse_spec,
    parse_time,
    to_operation,
)
from awa.core.errors import BatchOperationNotFound, ValidationError
from awa.core.model import Job
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries

Executor = Conn | asyncpg.Pool

# -- operations ------------------------------------------------------------------------


async def preview(db: Executor, q: Queries, op_kind: str, spec: Mapping[str, Any],
                  filter: Mapping[str, Any] | None) -> BatchOperationPreview:
    """Count the queued jobs ``filter`` matches now and show the first few."""
    parse_spec(op_kind, spec)
    f = parse_filter(filter)
    with translated():
        total = await db.fetchval(q["batch_preview_count"], *f.params())
        rows = await db.fetch(q["batch_preview_sample"], *f.params(), SAMPLE_SIZE)
    return BatchOperationPreview(total_matched=int(total),
                                 sample=[Job.from_row(r).to_dict() for r in rows])


async def submit(db: Executor, q: Queries, op_kind: str, spec: Mapping[str, Any],
                 filter: Mapping[str, Any] | None, *, submitted_by: str | None = None,
                 allow_all: bool = False) -> BatchOperation:
    """Validate, then record a pending operation for the maintenance leader."""
    stored_spec = parse_spec(op_kind, spec)
    f = parse_filter(filter)
    if f.empty and not allow_all:
        raise ValidationError("filter", "batch operation requires a filter or allow_all=True")
    if submitted_by is not None:
        submitted_by = validate.check_name("submitted_by", submitted_by)
    with translated():
        row = await db.fetchrow(q["batch_insert"], uuid.uuid4(), op_kind, f.to_json(),
                                stored_spec, submitted_by)
    return to_operation(row)


async def list_operations(db: Executor, q: Queries, *, state: str | None = None,
                          limit: int = 100) -> list[BatchOperation]:
    """Operations, newest first."""
    if state is not None and state not in STATES:
        raise ValidationError("state", f"unknown batch operation state: {state}")
    validate.check_int("limit", limit, 1, 10_000)
    with translated():
        rows = await db.fetch(q["batch_list"], state, limit)
    return [to_operation(r) for r in rows]


async def get_operation(db: Executor, q: Queries, op_id: Any) -> BatchOperation:
    """One operation; `BatchOperationNotFound` if there is none with this id."""
    parsed = operation_id(op_id)
    with translated():
        row = await db.fetchrow(q["batch_get"], parsed)
    if row is None:
        raise BatchOperationNotFound(f"batch operation not found: {parsed}")
    return to_operation(row)


async def cancel_operation(db: Executor, q: Queries, op_id: Any) -> BatchOperation:
    """Ask an operation to stop: ``cancelling`` until the leader's runner finalises it
    (a running one after the chunk in flight, a pending one on its next pass)."""
    parsed = operation_id(op_id)
    with translated():
        row = await db.fetchrow(q["batch_cancel"], parsed, RETENTION)
    if row is not None:
        return to_operation(row)
    op = await get_operation(db, q, parsed)
    if op["state"] == "cancelling":
        return op
    raise ValidationError("operation_id", f"batch operation cannot be cancelled: {parsed}")


async def purge_operations(db: Executor, q: Queries, before: datetime, *,
                           limit: int = 1000) -> int:
    """Delete up to ``limit`` finished operations finalized before ``before``."""
    before = parse_time("before", before)
    validate.check_int("limit", limit, 1, 1_000_000)
    with translated():
        return int(await db.fetchval(q["batch_purge"], before, limit))


class BatchOps:
    """Mixed into `AsyncClient`: the batch operation methods (needs ``pool()``, ``_q``)."""

    _q: Queries

    async def pool(self) -> asyncpg.Pool:
        raise NotImplementedError

    async def preview_batch_operation(self, op_kind: BatchOperationKind, *,
                                      spec: dict[str, Any],
                                      filter: BatchOperationFilter | None = None
                                      ) -> BatchOperationPreview:
        """How many queued jobs the operation would act on now, and a sample."""
        return await preview(await self.pool(), self._q, op_kind, spec, _raw(filter))

    async def submit_batch_operation(self, op_kind: BatchOperationKind, *,
                                     spec: dict[str, Any],
                                     filter: BatchOperationFilter | None = None,
                                     submitted_by: str | None = None,
                                     allow_all: bool = False) -> BatchOperation:
        """Record an operation for the maintenance leader to run (empty filter needs allow_all)."""
        return await submit(await self.pool(), self._q, op_kind, spec, _raw(filter),
                            submitted_by=submitted_by, allow_all=allow_all)

    async def preview_set_priority(self, priority: int, *,
                                   filter: BatchOperationFilter | None = None
                                   ) -> BatchOperationPreview:
        """Preview giving matching queued jobs ``priority``."""
        return await self.preview_batch_operation("set_priority", spec={"priority": priority},
                                                  filter=filter)

    async def set_priority(self, priority: int, *, filter: BatchOperationFilter | None = None,
                           submitted_by: str | None = None,
                           allow_all: bool = False) -> BatchOperation:
        """Submit giving matching queued jobs ``priority``."""
        return await self.submit_batch_operation(
            "set_priority", spec={"priority": priority}, filter=filter,
            submitted_by=submitted_by, allow_all=allow_all)

    async def preview_move_queue(self, queue: str, *, priority: int | None = None,
                                 filter: BatchOperationFilter | None = None
                                 ) -> BatchOperationPreview:
        """Preview moving matching queued jobs to ``queue`` (and ``priority``)."""
        return await self.preview_batch_operation("move_queue", spec=_move(queue, priority),
                                                  filter=filter)

    async def move_queue(self, queue: str, *, priority: int | None = None,
                         filter: BatchOperationFilter | None = None,
                         submitted_by: str | None = None,
                         allow_all: bool = False) -> BatchOperation:
        """Submit moving matching queued jobs to ``queue`` (and ``priority``)."""
        return await self.submit_batch_operation(
            "move_queue", spec=_move(queue, priority), filter=filter,
            submitted_by=submitted_by, allow_all=allow_all)

    async def list_batch_operations(self, *, state: BatchOperationState | None = None,
                                    limit: int = 100) -> list[BatchOperation]:
        """Batch operations, newest first, optionally in one state."""
        return await list_operations(await self.pool(), self._q, state=state, limit=limit)

    async def get_batch_operation(self, operation_id: str) -> BatchOperation:
        """One batch operation by id."""
        return await get_operation(await self.pool(), self._q, operation_id)

    async def cancel_batch_operation(self, operation_id: str) -> BatchOperation:
        """Cancel a pending operation, or stop a running one after its current chunk."""
        return await cancel_operation(await self.pool(), self._q, operation_id)

    async def purge_batch_operations(self, before: datetime, *, limit: int = 1000) -> int:
        """Delete finished operations finalized before ``before``; returns how many."""
        return await purge_operations(await self.pool(), self._q, before, limit=limit)


def _raw(filter: BatchOperationFilter | None) -> Mapping[str, Any] | None:
    return cast("Mapping[str, Any] | None", filter)


def _move(queue: str, priority: int | None) -> dict[str, Any]:
    return {"queue": queue} if priority is None else {"queue": queue, "priority": priority}
