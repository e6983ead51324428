"""The one enqueue pipeline: prepare → parents → backpressure → insert → attach.

Every surface runs it: `AsyncClient` (and the sync `Client` through it) and
`Transaction` with a `Pipeline` on the connection they choose; the bridge
(and Django's backend through it) with `prepare_one` and `Enqueue.plan` on the
application's driver. A call's options arrive as one `EnqueueOptions` dict,
so no surface repeats them.

1. **prepare** (`prepare_one`, `prepare_batch`): the job's options and args
   validated and serialized (`producer`), ``after`` / ``on_parent_failure``
   checked (`dependencies`), the ``backpressure`` option checked: a bad input
   raises here, before a connection is taken.
2. **backpressure**: each queue's depth counted on the writing connection, a
   full one refused (`awa.enqueue.backpressure`); nothing counted for "off".
3. **insert**: one job (`producer.insert_one`; with parents
   `dependencies.insert_after`), a batch as one statement or by COPY
   (`producer.insert_many`, `dependencies.insert_many_after`), or the
   counting COPY path (`producer.copy_many`, `dependencies.copy_many_after`).
4. **attach**: each `InsertedJob` gets the surface's waiter and the depth its
   queue was measured at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, cast

from awa.core.backpressure import QueueDepth, count_cap
from awa.core.options import CALL_OPTIONS, EnqueueOptions
from awa.core.results import AsyncWaiter, InsertedJob
from awa.db.errors import translated
from awa.db.lanes import Lanes
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.enqueue import dependencies, producer
from awa.enqueue.backpressure import check, check_plan
from awa.enqueue.dependencies import Parents
from awa.enqueue.plan import Plan, Row
from awa.enqueue.producer import PreparedJob, Router

#: Per-job options of a bulk insert (``opts[i]``; may carry ``after`` / ``on_parent_failure``).
PerJob = Sequence[Mapping[str, Any] | None] | None
Depths = dict[str, QueueDepth]
#: Where a pipeline writes: ``async with connect() as conn``.
Connect = Callable[[], AbstractAsyncContextManager[Conn]]


@dataclasses.dataclass(slots=True)
class Enqueue:
    """One call's enqueue, checked and ready to write (nothing written yet)."""

    jobs: list[PreparedJob]
    #: What each job waits for (None: nothing); None when no job of the call waits.
    parents: list[Parents | None] | None
    backpressure: Any

    def plan(self) -> Plan[tuple[Row, Depths]]:
        """A single job's backpressure count, then its insert (with its edges when it
        waits), as one plan for any driver: the inserted row and the depths seen."""
        depths = yield from check_plan(self.jobs, self.backpressure)
        if self.parents is None:
            row = yield "job_insert", self.jobs[0].insert_params()
        else:
            ids, policy = cast(Parents, self.parents[0])
            row = yield from dependencies.insert_after_plan(self.jobs[0], ids, policy)
        assert row is not None
        return row, depths


def _split(opts: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any, Any, Any]:
    """The job's own options, then ``after``, ``on_parent_failure``, ``backpressure``."""
    if CALL_OPTIONS.isdisjoint(opts):  # the common call: no copy
        return opts, None, "cancel", "off"
    own = dict(opts)
    return (own, own.pop("after", None), own.pop("on_parent_failure", "cancel"),
            own.pop("backpressure", "off"))


def prepare_one(args: Any, opts: EnqueueOptions, router: Router | None = None) -> Enqueue:
    """Stage 1 for one job: validate everything the call carries, in this order
    (the job, its parents, the backpressure option); raises before any write."""
    own, after, policy, backpressure = _split(opts)
    job = producer.prepare(args, **own, router=router)
    parents = dependencies.parents_of(after, policy)
    if backpressure != "off":
        count_cap(backpressure)  # a bad option raises before a connection is taken
    return Enqueue([job], None if parents is None else [parents], backpressure)


def prepare_batch(jobs: Sequence[Any], per_job: PerJob, opts: EnqueueOptions,
                  router: Router | None = None) -> Enqueue:
    """Stage 1 for a batch: ``per_job[i]`` overrides ``opts`` for job ``i`` (its
    ``after`` / ``on_parent_failure`` too); raises before any write."""
    own, after, policy, backpressure = _split(opts)
    per_job, parents = dependencies.parents_many(len(jobs), per_job, after, policy)
    prepared = producer.prepare_many(jobs, per_job, own, router)
    count_cap(backpressure)
    return Enqueue(prepared, parents, backpressure)


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline:
    """The pipeline on asyncpg: a surface builds one with the connection it writes
    on (``connect``) and delegates each enqueue method to it in one line."""

    q: Queries
    connect: Connect
    router: Router | None = None  #: the queue of a kind's task, for jobs naming none
    waiter: AsyncWaiter | None = None  #: what ``job.wait()`` calls
    seen: Callable[[Depths], object] | None = None  #: told every depth measured
    lanes: Lanes | None = None  #: whether the ring takes inserts (None: always route)

    async def insert(self, args: Any, opts: EnqueueOptions) -> InsertedJob:
        """Enqueue one job; `UniqueConflict` if its unique key is taken."""
        e = prepare_one(args, opts, self.router)
        job = e.jobs[0]
        async with self.connect() as conn:
            depths = {} if e.backpressure == "off" else await self._measure(conn, e)
            if e.parents is None:
                with translated():  # an unmigrated schema says so, as the insert would
                    ring = None if self.lanes is None else await self.lanes.enqueue(conn)
                inserted = await producer.insert_one(conn, self.q, job, InsertedJob, ring)
            else:
                ids, policy = cast(Parents, e.parents[0])
                inserted = await dependencies.insert_after(conn, self.q, job, ids, policy,
                                                           job_type=InsertedJob)
        return InsertedJob.attach(inserted, async_waiter=self.waiter, depth=depths.get(job.queue))

    async def insert_many(self, jobs: Sequence[Any], per_job: PerJob, opts: EnqueueOptions, *,
                          copy: bool | None = None) -> list[InsertedJob]:
        """Enqueue a batch, skipping duplicate unique keys; ``copy`` as in
        `producer.insert_many` (None: one statement up to 1,000 jobs, else COPY)."""
        e = prepare_batch(jobs, per_job, opts, self.router)
        async with self.connect() as conn:
            depths = await self._measure(conn, e)
            if e.parents is None:
                inserted = await producer.insert_many(conn, self.q, e.jobs, InsertedJob,
                                                      copy=copy)
            else:
                inserted = await dependencies.insert_many_after(conn, self.q, e.jobs, e.parents,
                                                                InsertedJob, copy=copy)
        return [InsertedJob.attach(j, async_waiter=self.waiter, depth=depths.get(j.queue))
                for j in inserted]

    async def count_many(self, jobs: Sequence[Any], per_job: PerJob,
                         opts: EnqueueOptions) -> int:
        """Enqueue a batch by the fastest path (binary COPY); how many were inserted."""
        e = prepare_batch(jobs, per_job, opts, self.router)
        async with self.connect() as conn:
            await self._measure(conn, e)
            if e.parents is None:
                return await producer.copy_many(conn, self.q, e.jobs)
            return await dependencies.copy_many_after(conn, self.q, e.jobs, e.parents)

    async def _measure(self, conn: Conn, e: Enqueue) -> Depths:
        """Stage 2: each queue's depth (or `QueueFull`), told to ``seen``."""
        if e.backpressure == "off":
            return {}
        depths = await check(conn, self.q, e.jobs, e.backpressure)
        if self.seen is not None:
            self.seen(depths)
        return depths


class Held:
    """A connection the surface already holds (a transaction's), as a `Connect`."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def __call__(self) -> Held:
        return self

    async def __aenter__(self) -> Conn:
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        return None
