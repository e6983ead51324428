"""Durable batch operations: change the priority or queue of many queued jobs.

An operation is validated and written here (`submit`), then run by the
maintenance leader (`awa.maintenance.batch`): it snapshots the matching
queued jobs (``scheduled``, ``available`` and ``retryable``, as `drain_queue`
acts on) and changes them a chunk at a time, each chunk one short
transaction that skips jobs that started, finished or stopped matching
meanwhile. ``preview`` shows the count and a sample without writing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict, cast

import asyncpg

from awa import producer, states
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.errors import BatchOperationNotFound, ValidationError
from awa.model import Job

Executor = Conn | asyncpg.Pool

BatchOperationKind = Literal["set_priority", "move_queue"]
BatchOperationState = Literal["pending", "scanning", "running", "cancelling", "completed",
                              "cancelled", "failed"]

KINDS: tuple[str, ...] = ("set_priority", "move_queue")
STATES: tuple[str, ...] = ("pending", "scanning", "running", "cancelling", "completed",
                           "cancelled", "failed")
ACTIVE_STATES = frozenset({"pending", "scanning", "running", "cancelling"})
TERMINAL_STATES = frozenset({"completed", "cancelled", "failed"})
#: The job states an operation acts on (and the values of the ``state`` filter).
QUEUED_STATES: tuple[str, ...] = tuple(sorted(str(s) for s in states.QUEUED))
#: Finished operations are kept this long, then pruned by maintenance.
RETENTION = timedelta(days=90)
SAMPLE_SIZE = 10
#: The form an operation id takes, shown when one is malformed.
UUID_EXAMPLE = "0b7e1f3a-6c2d-4e5f-8a9b-1c2d3e4f5a6b"
MAX_IDS = 100_000
FILTER_KEYS: tuple[str, ...] = ("kind", "queue", "ids", "tag", "state", "created_at_gte",
                                "created_at_lt")


class BatchOperationFilter(TypedDict, total=False):
    """Which queued jobs an operation acts on; every given key must match."""

    kind: str
    queue: str
    ids: list[int]
    tag: str
    state: str  #: "available", "scheduled" or "retryable"
    created_at_gte: datetime | str
    created_at_lt: datetime | str


class BatchOperationPreview(TypedDict):
    """How many queued jobs match now, and the first few (job dicts)."""

    total_matched: int
    sample: list[dict[str, Any]]


class BatchOperation(TypedDict):
    """One submitted operation and its progress (times as ISO-8601 strings)."""

    id: str
    op_kind: str
    filter: dict[str, Any]
    spec: dict[str, Any]
    state: str
    submitted_by: str | None
    submitted_at: str
    started_at: str | None
    finalized_at: str | None
    cursor: dict[str, Any] | None
    total_matched: int | None
    processed: int
    skipped: int
    errored: int
    last_error: str | None
    runner_instance: str | None
    retention_until: str | None
    updated_at: str


# -- validation ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    """A validated filter; ``params()`` are the ``$1..$7`` of ``batch.sql``."""

    kind: str | None = None
    queue: str | None = None
    ids: list[int] | None = None
    tag: str | None = None
    state: str | None = None
    created_at_gte: datetime | None = None
    created_at_lt: datetime | None = None

    @property
    def empty(self) -> bool:
        """True when nothing narrows the operation (it would act on every queued job)."""
        return all(getattr(self, k) is None for k in FILTER_KEYS)

    def params(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in FILTER_KEYS)

    def to_json(self) -> dict[str, Any]:
        """Every key, None when unset, times as ISO strings (as stored)."""
        out = {k: getattr(self, k) for k in FILTER_KEYS}
        for key in ("created_at_gte", "created_at_lt"):
            if out[key] is not None:
                out[key] = out[key].isoformat()
        return out


def _time(field: str, value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(field, "must be an ISO-8601 time") from None
    if not isinstance(value, datetime):
        raise ValidationError(field, "must be a datetime or an ISO-8601 string")
    return producer.as_utc(value, field)


def _ids(value: Any) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValidationError("filter.ids", "must be a list of job ids")
    if len(value) > MAX_IDS:
        raise ValidationError("filter.ids", f"at most {MAX_IDS} ids")
    return [producer.check_int("filter.ids", i, 1, 2**63 - 1) for i in value]


def _queued_state(value: Any) -> str:
    names = {str(s): str(s) for s in states.QUEUED} | {s.name: str(s) for s in states.QUEUED}
    key = str(value) if isinstance(value, states.JobState) else value
    if not isinstance(key, str) or key not in names:
        raise ValidationError("filter.state", "batch operations act on queued jobs: use "
                              f"{', '.join(QUEUED_STATES)}")
    return names[key]


def parse_filter(raw: Mapping[str, Any] | None) -> Filter:
    """Validate a filter dict (None, or keys with None values, mean "any")."""
    if raw is None:
        return Filter()
    if not isinstance(raw, Mapping):
        raise ValidationError("filter", "must be a dict")
    unknown = set(raw) - set(FILTER_KEYS)
    if unknown:
        raise ValidationError("filter", f"unknown key(s) {sorted(unknown)}; "
                              f"use {', '.join(FILTER_KEYS)}")
    values: dict[str, Any] = {}
    for key in ("kind", "queue", "tag"):
        if raw.get(key) is not None:
            values[key] = producer.check_name(f"filter.{key}", raw[key])
    if raw.get("ids") is not None:
        values["ids"] = _ids(raw["ids"])
    if raw.get("state") is not None:
        values["state"] = _queued_state(raw["state"])
    for key in ("created_at_gte", "created_at_lt"):
        if raw.get(key) is not None:
            values[key] = _time(f"filter.{key}", raw[key])
    return Filter(**values)


def parse_spec(op_kind: Any, spec: Any) -> dict[str, Any]:
    """Validate ``spec`` for ``op_kind``; returns it as stored (with ``op_kind``)."""
    if op_kind not in KINDS:
        raise ValidationError("op_kind", f"unknown batch operation kind: {op_kind} "
                              f"(use {' or '.join(KINDS)})")
    if not isinstance(spec, Mapping):
        raise ValidationError("spec", "must be a dict")
    allowed = {"op_kind", "priority"} | ({"queue"} if op_kind == "move_queue" else set())
    unknown = set(spec) - allowed
    if unknown:
        raise ValidationError("spec", f"unknown key(s) {sorted(unknown)} for {op_kind}")
    if spec.get("op_kind", op_kind) != op_kind:
        raise ValidationError("spec.op_kind", f"does not match {op_kind}")
    out: dict[str, Any] = {"op_kind": op_kind}
    if op_kind == "move_queue":
        out["queue"] = producer.check_name("queue", spec.get("queue"))
    priority = spec.get("priority")
    if priority is not None or op_kind == "set_priority":
        out["priority"] = producer.check_int("priority", priority, states.PRIORITY_MIN,
                                             states.PRIORITY_MAX)
    return out


def spec_params(spec: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The new priority and new queue of a stored spec (None: unchanged)."""
    return spec.get("priority"), spec.get("queue") if spec["op_kind"] == "move_queue" else None


def operation_id(value: Any) -> uuid.UUID:
    """Parse an operation id (a UUID string); `ValidationError` naming the rule if malformed."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        shown = str(value) if len(str(value)) <= 64 else f"{str(value)[:64]}…"
        raise ValidationError("operation_id", f"invalid batch operation id {shown!r}: must be "
                              f"a UUID, like {UUID_EXAMPLE}") from None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def to_operation(row: Any) -> BatchOperation:
    """A database row as the public dict."""
    return BatchOperation(
        id=str(row["id"]), op_kind=row["op_kind"],
        filter={k: row["filter"].get(k) for k in FILTER_KEYS},
        spec={"op_kind": row["op_kind"], **row["spec"]},
        state=row["state"], submitted_by=row["submitted_by"],
        submitted_at=cast(str, _iso(row["submitted_at"])), started_at=_iso(row["started_at"]),
        finalized_at=_iso(row["finalized_at"]), cursor=row["cursor"],
        total_matched=row["total_matched"], processed=row["processed"],
        skipped=row["skipped"], errored=row["errored"], last_error=row["last_error"],
        runner_instance=row["runner_instance"], retention_until=_iso(row["retention_until"]),
        updated_at=cast(str, _iso(row["updated_at"])))


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
        submitted_by = producer.check_name("submitted_by", submitted_by)
    with translated():
        row = await db.fetchrow(q["batch_insert"], uuid.uuid4(), op_kind, f.to_json(),
                                stored_spec, submitted_by)
    return to_operation(row)


async def list_operations(db: Executor, q: Queries, *, state: str | None = None,
                          limit: int = 100) -> list[BatchOperation]:
    """Operations, newest first."""
    if state is not None and state not in STATES:
        raise ValidationError("state", f"unknown batch operation state: {state}")
    producer.check_int("limit", limit, 1, 10_000)
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
    before = _time("before", before)
    producer.check_int("limit", limit, 1, 1_000_000)
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
