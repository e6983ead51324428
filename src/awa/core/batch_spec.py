"""Batch operations as data: their kinds, states, filters and specs, validated.

Core layer (no I/O): shared by the admin API that submits operations
(`awa.admin.batch`) and the leader's runner that carries them out
(`awa.maintenance.batch`).

Durable batch operations change the priority or queue of many queued jobs.

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

from awa.core import states, validate
from awa.core.errors import ValidationError

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


def parse_time(field: str, value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(field, "must be an ISO-8601 time") from None
    if not isinstance(value, datetime):
        raise ValidationError(field, "must be a datetime or an ISO-8601 string")
    return validate.as_utc(value, field)


def _ids(value: Any) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValidationError("filter.ids", "must be a list of job ids")
    if len(value) > MAX_IDS:
        raise ValidationError("filter.ids", f"at most {MAX_IDS} ids")
    return [validate.check_int("filter.ids", i, 1, 2**63 - 1) for i in value]


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
            values[key] = validate.check_name(f"filter.{key}", raw[key])
    if raw.get("ids") is not None:
        values["ids"] = _ids(raw["ids"])
    if raw.get("state") is not None:
        values["state"] = _queued_state(raw["state"])
    for key in ("created_at_gte", "created_at_lt"):
        if raw.get(key) is not None:
            values[key] = parse_time(f"filter.{key}", raw[key])
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
        out["queue"] = validate.check_name("queue", spec.get("queue"))
    priority = spec.get("priority")
    if priority is not None or op_kind == "set_priority":
        out["priority"] = validate.check_int("priority", priority, states.PRIORITY_MIN,
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
