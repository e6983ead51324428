"""Producer: validate and serialize a job, then insert it (one, many, or COPY).

First stop of the pipeline (producer → Postgres → dispatcher → executor →
completion). Everything a job carries is checked here, before any write, with
a `ValidationError` naming the field and the rule; the schema repeats the
checks as a second line. No SQL is built from user input: values travel only
as bind parameters or COPY data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from awa.core import states
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.core.serialize import (
    args_to_dict,
    dumps,
    dumps_many,
    field_names,
    kind_of,
    unique_key,
)
from awa.core.states import JobState
from awa.core.validate import (
    check_concurrency,
    check_int,
    check_name,
    check_run_at,
    check_tags,
    parse_unique_opts,
)
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.telemetry import otel as telemetry


@dataclasses.dataclass(slots=True)
class PreparedJob:
    """A validated, serialized job, ready for any insert path.

    Treated as a value (change one with `dataclasses.replace`); not frozen
    because a frozen dataclass's ``__init__`` costs ~5 µs per job, most of
    what preparing a bulk insert costs."""

    kind: str
    queue: str
    args: dict[str, Any]
    args_json: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    tags: list[str]
    metadata_json: str
    unique_key: bytes | None
    unique_states: int | None
    ordering_key: str | None
    #: Per-key concurrency: the key, and its max_in_flight (None: the queue's).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None

    def insert_params(self) -> tuple[Any, ...]:
        """Bind parameters of the ``job_insert`` statement, in order."""
        return (self.kind, self.queue, self.args_json, self.run_at, self.priority,
                self.max_attempts, self.tags, self.metadata_json, self.unique_key,
                self.unique_states, self.ordering_key, self.concurrency_key,
                self.concurrency_limit)

    def inserted(self, job_type: type[J], job_id: int, state: str,
                 created_at: datetime) -> J:
        """The `Job` this was inserted as, from what the server chose (``job_insert_one``):
        the rest is what was sent, its JSON read back as a row of it would be."""
        run_at = created_at if self.run_at is None else self.run_at.astimezone(UTC)
        metadata = {} if self.metadata_json == "{}" else json.loads(self.metadata_json)
        return job_type(job_id, self.kind, self.queue, JobState(state), self.priority, 0,
                        self.max_attempts, json.loads(self.args_json), run_at, created_at,
                        list(self.tags), metadata, [], unique_key=self.unique_key,
                        ordering_key=self.ordering_key, concurrency_key=self.concurrency_key,
                        concurrency_limit=self.concurrency_limit)


J = TypeVar("J", bound=Job)

#: A client's registered queue for a kind, for inserts that name no queue.
Router = Callable[[str], str]


@dataclasses.dataclass(slots=True)
class _Options:
    """Validated insert options, shared by every job of a bulk insert (not
    frozen, as `PreparedJob`: built once per single insert)."""

    kind: str | None
    queue: str | None  #: None: the kind's registered queue (`Router`), else "default"
    priority: int
    max_attempts: int
    tags: list[str]
    metadata_json: str
    run_at: datetime | None
    unique: tuple[bool, bool, int | None, int] | None
    ordering_key: str | None
    router: Router | None = None
    concurrency: tuple[str | None, int | None] = (None, None)  #: key, max_in_flight


def _options(kind: str | None = None, queue: str | None = None,
             priority: int = states.PRIORITY_DEFAULT,
             max_attempts: int = states.MAX_ATTEMPTS_DEFAULT, tags: Sequence[str] | None = None,
             metadata: Mapping[str, Any] | None = None, run_at: datetime | str | None = None,
             unique_opts: Mapping[str, Any] | None = None,
             ordering_key: str | bytes | None = None, router: Router | None = None,
             concurrency_key: str | None = None, max_in_flight: int | None = None
             ) -> _Options:
    if kind is not None:
        check_name("kind", kind)
    if queue is not None:
        check_name("queue", queue)
    check_int("priority", priority, states.PRIORITY_MIN, states.PRIORITY_MAX)
    check_int("max_attempts", max_attempts, states.MAX_ATTEMPTS_MIN, states.MAX_ATTEMPTS_MAX)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValidationError("metadata", "must be a dict")
    if isinstance(ordering_key, bytes | bytearray | memoryview):  # awa-pg's bytes keys
        try:
            ordering_key = bytes(ordering_key).decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError("ordering_key", "bytes must be UTF-8 text") from None
    if ordering_key is not None:
        check_name("ordering_key", ordering_key)
    concurrency = check_concurrency(concurrency_key, max_in_flight)
    metadata = telemetry.with_traceparent(metadata)  # once per call, not per job
    return _Options(kind=kind, queue=queue, priority=priority, max_attempts=max_attempts,
                    tags=check_tags(tags),
                    metadata_json=dumps(dict(metadata), "metadata") if metadata else "{}",
                    run_at=check_run_at(run_at), unique=parse_unique_opts(unique_opts),
                    ordering_key=ordering_key, router=router, concurrency=concurrency)


#: Derived kinds already checked by `check_name` (bulk inserts check each job's).
_checked_kinds: set[str] = set()


def _with_args(o: _Options, args: Any) -> PreparedJob:
    derived, args_dict = args_to_dict(args)
    kind = o.kind if o.kind is not None else derived
    if kind is None:
        raise ValidationError("kind", "required when args is a dict")
    if o.kind is None and kind not in _checked_kinds:
        check_name("kind", kind)
        if len(_checked_kinds) < 10_000:  # kinds derived from classes: a handful
            _checked_kinds.add(kind)
    unique = o.unique
    args_json = dumps(args_dict, "args")  # validates before the key hashes the args
    queue = o.queue if o.queue is not None else (
        o.router(kind) if o.router is not None else states.DEFAULT_QUEUE)
    key = unique_key(kind, queue, args_dict, *unique[:3]) if unique else None
    return PreparedJob(
        kind=kind, queue=queue, args=args_dict, args_json=args_json,
        priority=o.priority, max_attempts=o.max_attempts, run_at=o.run_at, tags=o.tags,
        metadata_json=o.metadata_json, unique_key=key,
        unique_states=unique[3] if unique else None, ordering_key=o.ordering_key,
        concurrency_key=o.concurrency[0], concurrency_limit=o.concurrency[1])


def prepare(args: Any, *, kind: str | None = None, queue: str | None = None,
            priority: int = states.PRIORITY_DEFAULT,
            max_attempts: int = states.MAX_ATTEMPTS_DEFAULT, tags: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None, run_at: datetime | str | None = None,
            unique_opts: Mapping[str, Any] | None = None,
            ordering_key: str | bytes | None = None,
            router: Router | None = None, concurrency_key: str | None = None,
            max_in_flight: int | None = None) -> PreparedJob:
    """Validate and serialize one job; raises before anything is written.

    With no ``queue``, the job goes to ``router(kind)`` (the queue its task is
    registered on) when a router is given, else to ``"default"``."""
    options = _options(kind, queue, priority, max_attempts, tags, metadata, run_at,
                       unique_opts, ordering_key, router, concurrency_key, max_in_flight)
    return _with_args(options, args)


def prepare_many(jobs: Sequence[Any], opts: Sequence[Mapping[str, Any] | None] | None,
                 defaults: Mapping[str, Any], router: Router | None = None) -> list[PreparedJob]:
    """Prepare a batch; ``opts[i]`` overrides ``defaults`` for job ``i``."""
    if opts is not None and len(opts) != len(jobs):
        raise ValidationError("opts", "must have one entry per job")
    try:
        shared = _options(**defaults, router=router)
    except TypeError as exc:
        raise TypeError(f"insert options: {exc}") from exc
    if opts is None or not any(opts):
        return _prepare_shared(shared, jobs) if shared.unique is None else [
            _with_args(shared, args) for args in jobs]
    prepared = []
    for i, args in enumerate(jobs):
        own = opts[i]
        if not own:
            prepared.append(_with_args(shared, args))
            continue
        try:
            prepared.append(prepare(args, **{**defaults, **own}, router=router))
        except TypeError as exc:
            raise TypeError(f"opts[{i}]: {exc}") from exc
    return prepared


def _prepare_shared(o: _Options, jobs: Sequence[Any]) -> list[PreparedJob]:
    """`_with_args` for a batch sharing one set of options and no unique key:
    kind, queue and field names found once per args type, the rest inlined."""
    by_type: dict[type, tuple[str, str, tuple[str, ...] | None] | None] = {}
    general: dict[int, PreparedJob] = {}
    specs: list[tuple[str, str, tuple[str, ...] | None]] = []
    dicts: list[dict[str, Any]] = []
    for i, args in enumerate(jobs):
        cls = type(args)
        try:
            spec = by_type[cls]
        except KeyError:
            spec = by_type[cls] = _type_spec(o, cls)
        if spec is None:  # a pydantic model, a Mapping subclass, a bad value: the general path
            general[i] = _with_args(o, args)
            spec, args = ("", "", None), {}  # a placeholder, replaced below
        specs.append(spec)
        names = spec[2]
        dicts.append(dict(args) if names is None else {f: getattr(args, f) for f in names})
    shared = (o.priority, o.max_attempts, o.run_at, o.tags, o.metadata_json, None, None,
              o.ordering_key, *o.concurrency)
    out = [PreparedJob(kind, queue, args_dict, text, *shared) for (kind, queue, _), args_dict, text
           in zip(specs, dicts, dumps_many(dicts, "args"), strict=True)]
    for i, job in general.items():
        out[i] = job
    return out


def _type_spec(o: _Options, cls: Any) -> tuple[str, str, tuple[str, ...] | None] | None:
    """Kind, queue and dataclass field names (None: a plain dict) for args of ``cls``."""
    names: tuple[str, ...] | None = None
    if hasattr(cls, "__dataclass_fields__") and not issubclass(cls, type):
        names = field_names(cls)
        kind = o.kind if o.kind is not None else check_name("kind", kind_of(cls))
    elif cls is dict and o.kind is not None:
        kind = o.kind
    else:
        return None  # `_with_args` takes it (and raises any error)
    queue = o.queue if o.queue is not None else (
        o.router(kind) if o.router is not None else states.DEFAULT_QUEUE)
    return kind, queue, names


async def insert_one(conn: Conn, q: Queries, job: PreparedJob,
                     job_type: type[J] = Job,  # type: ignore[assignment]
                     ring: bool | None = None) -> J:
    """Insert one prepared job; raises `UniqueConflict` on a duplicate key.

    ``job_type``: the `Job` class to build (the client's `InsertedJob`).
    ``ring``: whether the append-only lane takes inserts (awa.db.lanes; None:
    not known, the server routes). Known either way, the statement goes
    straight to the job's table: the routing costs a tenth of a single insert."""
    with translated():
        if ring and _ring_plain(job, None):
            row = await conn.fetchrow(q["job_insert_one_ring"], job.kind, job.queue,
                                      job.args_json, job.priority, job.max_attempts, job.tags,
                                      job.metadata_json)
        else:
            name = "job_insert_one_mutable" if ring is False else "job_insert_one"
            row = await conn.fetchrow(q[name], *job.insert_params())
    job_id, state, created_at = cast("tuple[int, str, datetime]", row)
    telemetry.inserted(job.kind, job.queue)
    return job.inserted(job_type, job_id, state, created_at)


_COPY_COLUMNS = ("kind", "queue", "args", "run_at", "priority", "max_attempts", "tags",
                 "metadata", "unique_key", "unique_states", "ordering_key", "concurrency_key",
                 "concurrency_limit")


async def stage(conn: Conn, q: Queries, records: list[tuple[Any, ...]], *,
                with_parents: bool = False, with_ids: bool = False) -> None:
    """COPY job records (`PreparedJob.insert_params`) into a staging table that lives
    until the transaction ends; ``with_parents``: each record goes on with the
    job's parent ids and policy (`dependencies.insert_many_after`); ``with_ids``:
    then with the id reserved for it (``job_ids_reserve``)."""
    await conn.execute(q["job_staging_create"])
    columns = (*_COPY_COLUMNS, "after_ids", "on_parent_failure") if with_parents \
        else _COPY_COLUMNS
    if with_ids:
        columns = (*columns, "job_id")
    await conn.copy_records_to_table("awa_job_staging", records=records, columns=columns)


#: Up to this many jobs, `insert_many` sends one statement (the columns as
#: arrays) instead of a staging table and COPY: one round trip instead of
#: five. Beyond it COPY wins (bench/README.md, "Insert path").
ONE_STATEMENT_MAX = 1000


def array_params(jobs: Sequence[PreparedJob]) -> tuple[Any, ...]:
    """Bind parameters of ``job_insert_many``: one array per column."""
    tags = jobs[0].tags
    shared_tags = all(j.tags is tags or j.tags == tags for j in jobs)
    cols: list[Sequence[Any]] = list(zip(*(j.insert_params() for j in jobs), strict=True))
    cols[6] = [None] * len(jobs) if shared_tags else [dumps(j.tags, "tags") for j in jobs]
    return (*cols, tags if shared_tags else None)


async def insert_many(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                      job_type: type[J] = Job, *,  # type: ignore[assignment]
                      copy: bool | None = None) -> list[J]:
    """Insert a batch, skipping duplicate unique keys, returning the inserted jobs.

    ``copy``: COPY into a staging table, then insert (True); one statement with
    the columns as arrays (False); None: by size (`one_statement`)."""
    if not jobs:
        return []
    with translated():
        if one_statement(jobs, copy):
            rows = await conn.fetch(q["job_insert_many"], *array_params(jobs))
        else:
            async with conn.transaction():
                await stage(conn, q, [j.insert_params() for j in jobs])
                rows = await conn.fetch(q["job_insert_from_staging"])
    inserted: list[J] = [job_type.from_row(r) for r in rows]  # type: ignore[misc]
    telemetry.inserted_jobs(inserted)
    return inserted


def one_statement(jobs: Sequence[PreparedJob], copy: bool | None) -> bool:
    """Whether a bulk insert of ``jobs`` sends them as one statement (the columns as
    arrays) rather than by COPY to a staging table (``copy``: None: by size)."""
    return len(jobs) <= ONE_STATEMENT_MAX if copy is None else not copy


_COPY_MANY_COLUMNS = ("kind", "queue", "args", "state", "run_at", "priority", "max_attempts",
                      "tags", "metadata", "ordering_key", "concurrency_key", "concurrency_limit")


def _copy_records(jobs: Sequence[PreparedJob]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The columns and records of `copy_many`'s COPY (no unique keys among ``jobs``)."""
    now = datetime.now(UTC)
    available, scheduled = JobState.Available.value, JobState.Scheduled.value
    # Jobs with no tags, metadata, ordering or concurrency key (the common
    # bulk load) leave those columns out of the COPY: the table defaults are
    # the same values, and each value sent costs an encoder call.
    plain = not any(j.tags or j.metadata_json != "{}" or j.ordering_key is not None
                    or j.concurrency_key is not None or j.concurrency_limit is not None
                    for j in jobs)
    if plain and all(j.run_at is None for j in jobs):
        # Due now: run_at left to its default, now() (the server's time, as
        # `job_insert` uses); the server's COPY is ~9% faster without it.
        return ((*_COPY_MANY_COLUMNS[:4], *_COPY_MANY_COLUMNS[5:7]),
                [(j.kind, j.queue, j.args_json, available, j.priority, j.max_attempts)
                 for j in jobs])
    if plain:
        return (_COPY_MANY_COLUMNS[:7],
                [(j.kind, j.queue, j.args_json,
                  scheduled if j.run_at is not None and j.run_at > now else available,
                  j.run_at or now, j.priority, j.max_attempts) for j in jobs])
    return (_COPY_MANY_COLUMNS,
            [(j.kind, j.queue, j.args_json,
              scheduled if j.run_at is not None and j.run_at > now else available,
              j.run_at or now, j.priority, j.max_attempts, j.tags, j.metadata_json,
              j.ordering_key, j.concurrency_key, j.concurrency_limit) for j in jobs])


async def copy_records(conn: Conn, q: Queries, jobs: Sequence[PreparedJob], *,
                       begin: bool = False, ids: Sequence[int] | None = None) -> int:
    """`copy_many`'s COPY (errors untranslated) in the transaction it opens
    (``begin``) or in the caller's: the wake-up trigger deferred until that
    transaction ends, each queue woken once at its commit. ``jobs`` carry no
    unique key; ``ids``: reserved for them (``job_ids_reserve``). When the
    append-only lane takes inserts (migration 0020), the plain ones go there."""
    await conn.execute(q["tx_begin_deferred_notify" if begin else "tx_defer_notify"])
    numbered = list(zip(ids, jobs, strict=True)) if ids is not None else None
    ring: list[int] = []
    lane = await conn.fetchrow(q["ring_takes_inserts"])
    assert lane is not None  # the ring's one row (migration 0020)
    if lane["enqueue"]:
        now = datetime.now(UTC)
        ring = [i for i, j in enumerate(jobs) if _ring_plain(j, now)]
    woken: set[str] = set()
    if ring:
        taken = set(ring)
        rest = [i for i in range(len(jobs)) if i not in taken]
        plain = [jobs[i] for i in ring]
        lanes = sorted({(j.queue, j.priority) for j in plain})
        await conn.execute(q["ring_lanes_known"], [lane[0] for lane in lanes],
                           [lane[1] for lane in lanes])
        await _copy(conn, q, "ready", *_ring_records(plain, now, lane["slot"]),
                    None if numbered is None else [numbered[i][0] for i in ring])
        woken.update(jobs[i].queue for i in ring)
        jobs = [jobs[i] for i in rest]
        ids = None if numbered is None else [numbered[i][0] for i in rest]
    if jobs:
        columns, rows = _copy_records(jobs)
        # The row-level wake-up trigger (0014) would call pg_notify once per row:
        # defer it, and wake each queue once, in the same transaction.
        available = JobState.Available.value
        woken.update(r[1] for r in rows if r[3] == available)
        await _copy(conn, q, "jobs", columns, rows, ids)
    if woken:
        await conn.execute(q["queue_notify"], sorted(woken))
    return len(ring) + len(jobs)


#: The columns `copy_records` sends to the append-only lane (awa.ready).
_RING_COLUMNS = ("slot", "kind", "queue", "args", "priority", "max_attempts", "tags",
                 "metadata", "run_at")


def _ring_records(jobs: Sequence[PreparedJob], now: datetime,
                  slot: int) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The columns and records of `copy_records`'s COPY into the append-only lane
    (into ``slot``, sent once rather than looked up per row); jobs all due now
    leave run_at to the server's time, as `_copy_records` does."""
    if all(j.run_at is None for j in jobs):
        return (_RING_COLUMNS[:-1], [(slot, j.kind, j.queue, j.args_json, j.priority,
                                      j.max_attempts, j.tags, j.metadata_json) for j in jobs])
    return (_RING_COLUMNS, [(slot, j.kind, j.queue, j.args_json, j.priority, j.max_attempts,
                             j.tags, j.metadata_json, j.run_at or now) for j in jobs])


def _ring_plain(job: PreparedJob, now: datetime | None) -> bool:
    """Whether ``job`` may live in the append-only lane: due now, no keys.
    ``now`` None: only a job without a run_at is due (the server's clock decides)."""
    return (job.unique_key is None and job.ordering_key is None
            and job.concurrency_key is None
            and (job.run_at is None or (now is not None and job.run_at <= now)))


async def _copy(conn: Conn, q: Queries, table: str, columns: tuple[str, ...],
                records: list[tuple[Any, ...]], ids: Sequence[int] | None) -> None:
    """Binary COPY of ``records`` into ``table``, with ``ids`` first when given."""
    if ids is not None:
        columns = ("id", *columns)
        records = [(i, *r) for i, r in zip(ids, records, strict=True)]
    await conn.copy_records_to_table(table, schema_name=q.schema, records=records,
                                     columns=columns)


async def copy_many(conn: Conn, q: Queries, jobs: Sequence[PreparedJob]) -> int:
    """The fastest bulk path: binary COPY straight into the jobs table."""
    if any(j.unique_key is not None for j in jobs):
        return len(await insert_many(conn, q, jobs))
    if not jobs:
        return 0
    with translated():
        try:
            count = await copy_records(conn, q, jobs, begin=True)
            await conn.execute("COMMIT")
        except BaseException:
            if not conn.is_closed() and conn.is_in_transaction():
                await conn.execute("ROLLBACK")
            raise
    telemetry.inserted_jobs(jobs)
    return count
