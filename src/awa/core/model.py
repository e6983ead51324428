"""The value types users see: jobs, queue stats, and handler outcomes."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Literal

from awa.core.states import JobState

_STATE = {s.value: s for s in JobState}
_from_epoch = datetime.fromtimestamp


def _rfc3339(value: datetime | None) -> str | None:
    """``value`` in UTC as RFC 3339 text (``datetime.isoformat``), or None."""
    return None if value is None else value.astimezone(UTC).isoformat()


@dataclass(slots=True)
class Job:
    """A job as stored, wherever it lives (active, finished or dead-lettered).

    A snapshot: changing a field changes nothing in the database. (Not a
    frozen dataclass: building a frozen one costs eight times as much, and a
    worker builds one per claimed job.)

    ``run_at``, ``created_at``, ``deadline`` and ``finalized_at`` are RFC 3339
    strings in UTC, as `awa-pg` returns them (``datetime.fromisoformat`` reads
    them back); the same instants as aware datetimes are the ``*_datetime``
    fields. The other times (``attempted_at``, ...) are datetimes.
    """

    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    args: dict[str, Any]
    run_at_datetime: datetime
    created_at_datetime: datetime
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    deadline_datetime: datetime | None = None
    finalized_at_datetime: datetime | None = None
    attempted_at: datetime | None = None
    heartbeat_at: datetime | None = None
    progress: dict[str, Any] | None = None
    output: Any = None
    run_lease: int = 0
    unique_key: bytes | None = None
    ordering_key: str | None = None
    callback_id: str | None = None
    callback_timeout_at: datetime | None = None
    #: Per-key concurrency: the key, its max_in_flight (None: the queue's) and
    #: the slot of its running (or last) attempt. See docs/guide/concurrency-keys.md.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    concurrency_slot: int | None = None
    #: Where a running attempt of the ring (the append-only lane, docs/storage.md)
    #: has its receipt; None in the mutable lane (awa.jobs). The worker's own:
    #: not shown, not compared, not serialized.
    receipt_slot: int | None = field(default=None, repr=False, compare=False)

    @property
    def run_at(self) -> str:
        """When the job is (or was) due to run, RFC 3339."""
        return self.run_at_datetime.astimezone(UTC).isoformat()

    @property
    def created_at(self) -> str:
        """When the job was inserted, RFC 3339."""
        return self.created_at_datetime.astimezone(UTC).isoformat()

    @property
    def deadline(self) -> str | None:
        """The running attempt's hard deadline, RFC 3339 (None when not running)."""
        return _rfc3339(self.deadline_datetime)

    @property
    def finalized_at(self) -> str | None:
        """When the job reached a terminal state, RFC 3339 (None before)."""
        return _rfc3339(self.finalized_at_datetime)

    @property
    def traceparent(self) -> str | None:
        """W3C trace context captured at enqueue, if any."""
        value = self.metadata.get("awa:traceparent")
        return value if isinstance(value, str) else None

    @classmethod
    def from_row(cls, row: Any) -> Job:
        """Build from a database row of ``awa.jobs_all`` (or a table like it; a
        completed row of ``awa.jobs_done`` stores empty tags and metadata as NULL)."""
        callback_id = row["callback_id"]
        return cls(
            id=row["id"], kind=row["kind"], queue=row["queue"],
            state=_STATE[row["state"]], priority=row["priority"],
            attempt=row["attempt"], max_attempts=row["max_attempts"],
            args=row["args"], run_at_datetime=row["run_at"],
            created_at_datetime=row["created_at"], tags=list(row["tags"] or ()),
            metadata=row["metadata"] or {}, errors=row["errors"] or [],
            deadline_datetime=row["deadline_at"], finalized_at_datetime=row["finalized_at"],
            attempted_at=row["attempted_at"], heartbeat_at=row["heartbeat_at"],
            progress=row["progress"], output=row["output"], run_lease=row["run_lease"],
            unique_key=row["unique_key"], ordering_key=row["ordering_key"],
            callback_id=str(callback_id) if callback_id is not None else None,
            callback_timeout_at=row["callback_timeout_at"],
            concurrency_key=row.get("concurrency_key"),
            concurrency_limit=row.get("concurrency_limit"),
            concurrency_slot=row.get("concurrency_slot"),
        )

    @classmethod
    def from_claim(cls, row: Any) -> Job:
        """Build from one row of a claim statement (``attempt_claim`` and the keyed
        claims): a running attempt. A batch is decoded with one `ClaimDecoder`."""
        return ClaimDecoder(row.keys(), keyed="concurrency_slot" in row.keys())(row)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (times ISO-8601, key base64)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _PRIVATE_FIELDS:
                continue
            value = getattr(self, f.name)
            name = f.name.removesuffix("_datetime")
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobState):
                value = str(value)
            elif isinstance(value, bytes):
                value = base64.b64encode(value).decode()
            out[name] = value
        out["traceparent"] = self.traceparent
        return out


#: `Job` fields that are the worker's own, left out of every view of a job.
_PRIVATE_FIELDS = frozenset({"receipt_slot"})
PUBLIC_FIELDS = tuple(f.name for f in fields(Job) if f.name not in _PRIVATE_FIELDS)

#: The columns of a claimed row, as the ``claimed_row`` fragment of
#: ``db/sql/attempt.sql`` names them (in its order, which is the fast case).
CLAIM_COLUMNS = ("id", "kind", "queue", "args", "priority", "attempt", "max_attempts",
                 "run_lease", "run_at", "created_at", "attempted_at", "deadline_at", "tags",
                 "metadata", "errors", "progress", "unique_key", "ordering_key")
#: What a keyed claim returns after them: the job's key, its limit and the slot granted.
KEY_COLUMNS = ("concurrency_key", "concurrency_limit", "concurrency_slot")


def _reader(columns: dict[str, int], names: tuple[str, ...]) -> Callable[[Any], Any] | None:
    """What reads ``names`` out of a row whose columns are at ``columns``: None when
    they are the row itself, in order; a slice when they are in a row, in order."""
    missing = [name for name in names if name not in columns]
    if missing:
        raise LookupError(f"a claimed row has no column {missing[0]!r} (it has "
                          f"{', '.join(columns)}): the claim statement and "
                          f"awa.core.model.CLAIM_COLUMNS disagree")
    first = columns[names[0]]
    at = [columns[name] for name in names]
    if at != list(range(first, first + len(names))):
        return itemgetter(*at)
    if first == 0 and len(columns) == len(names):
        return None
    return itemgetter(slice(first, first + len(names)))


class ClaimDecoder:
    """Builds `Job`s from the rows of one claim statement, reading each column by name.

    The names are looked up once, in the columns the statement returns (all
    its rows share them), and each row is then read by the positions found:
    a worker builds one `Job` per job, and decoding is a large part of its
    time per job. A column missing raises `LookupError` naming it. Times
    arrive as epoch seconds: building datetimes from them costs half as much
    as decoding timestamps (measured)."""

    __slots__ = ("_claimed", "_keys", "_slot")

    def __init__(self, columns: Iterable[str], keyed: bool = False) -> None:
        at = {name: i for i, name in enumerate(columns)}
        self._claimed = _reader(at, CLAIM_COLUMNS)
        self._keys = _reader(at, KEY_COLUMNS) if keyed else None
        #: Where the ring's receipt slot is (claims of awa.claim return one).
        self._slot = at.get("receipt_slot")

    def __call__(self, row: Any) -> Job:
        """The running attempt a claimed row describes (its heartbeat is its start)."""
        claimed = self._claimed
        (id, kind, queue, args, priority, attempt, max_attempts, run_lease, run_at,
         created_at, attempted_at, deadline_at, tags, metadata, errors, progress,
         unique_key, ordering_key) = row if claimed is None else claimed(row)
        started = _from_epoch(attempted_at, UTC)
        due = _from_epoch(run_at, UTC)
        # Datetimes are immutable: a job due when inserted shares one (the usual case).
        created = due if created_at == run_at else _from_epoch(created_at, UTC)
        job = Job(id, kind, queue, JobState.Running, priority, attempt, max_attempts, args,
                  due, created, tags or [],
                  metadata or {}, errors or [],
                  None if deadline_at is None else _from_epoch(deadline_at, UTC),
                  None, started, started, progress, None, run_lease, unique_key,
                  ordering_key)
        keys = self._keys
        if keys is not None:
            job.concurrency_key, job.concurrency_limit, job.concurrency_slot = keys(row)
        if self._slot is not None:
            job.receipt_slot = row[self._slot]
        return job


@dataclass(frozen=True, slots=True)
class QueueStat:
    """Counts and lag of one queue, as ``queue_stats`` reports them."""

    queue: str
    total_queued: int
    scheduled: int
    available: int
    retryable: int
    running: int
    failed: int
    waiting_external: int
    completed_last_hour: int
    lag_seconds: float | None
    paused: bool


@dataclass(frozen=True, slots=True)
class KeyStat:
    """One concurrency key in flight on one queue (`concurrency_keys`): what an
    operator needs to see that a key is at its limit and jobs wait behind it."""

    queue: str
    key: str
    running: int  #: its jobs in flight on this queue (running or waiting in place)
    in_flight: int  #: its jobs in flight on every queue: what its limit counts
    max_in_flight: int  #: its limit (the jobs' own, else the queue's, else 1)
    waiting: int  #: its available jobs on this queue, counted up to KEY_WAITING_CAP
    waiting_at_least: bool  #: the count stopped at the cap: at least `waiting` wait
    saturated: bool  #: every slot taken: its next job waits for one to free


@dataclass(frozen=True, slots=True)
class RetryFailedResult:
    """What a bulk `retry_failed` did: the re-queued jobs and how many matched."""

    jobs: list[Job] = field(default_factory=list)
    matched: int = 0
    pruned_failed_count: int | None = None


# -- handler outcomes: what a handler may return ------------------------------


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Return to retry after ``seconds``; consumes an attempt."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Snooze:
    """Return to run again after ``seconds`` without consuming an attempt."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Return to cancel the job."""

    reason: str = "cancelled by handler"


@dataclass(frozen=True, slots=True)
class CallbackToken:
    """A registered external callback; ``id`` is a UUID string."""

    id: str

    @classmethod
    def new(cls) -> CallbackToken:
        return cls(str(uuid.uuid4()))


@dataclass(frozen=True, slots=True)
class WaitForCallback:
    """Return to park the job until the callback ``token`` is resolved."""

    token: CallbackToken


@dataclass(frozen=True, slots=True)
class ResolveResult:
    """What `resolve_callback` did: completed, failed or ignored (left waiting)."""

    outcome: str  #: "completed", "failed" or "ignored"
    job: Job | None  #: the finished job; None when ignored
    payload: Any  #: the payload as stored (after ``transform``) or as given
    reason: str | None = None  #: why, when a rule or the default decided

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_ignored(self) -> bool:
        return self.outcome == "ignored"


@dataclass(frozen=True, slots=True)
class Output:
    """Return to complete and retain ``value`` on the job for inspection."""

    value: Any


#: "lost": a caller-owned completion found its run lease stale; nothing to write.
OutcomeKind = Literal["completed", "retry", "snooze", "cancel", "fail", "wait", "lost"]


@dataclass(slots=True)
class Outcome:
    """What an attempt came to, ready to be written."""

    kind: OutcomeKind
    delay: float | None = None  #: seconds, for retry (None = backoff) and snooze
    error: str | None = None  #: the errors-list message, for retry / fail / cancel
    terminal: bool = False  #: a fail caused by TerminalError (not by running out of attempts)
    output_json: str | None = None  #: retained output of a completed job
    token: str | None = None  #: callback id, for wait
    committed: bool = False  #: a caller-owned completion already committed it
