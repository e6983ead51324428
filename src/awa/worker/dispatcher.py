"""Dispatcher: one claim loop per queue.

Second stop of the pipeline (Postgres → dispatcher → executor). It claims as
many jobs as the queue has free slots (capped by the claim batch size and the
rate limit) and hands each to the runtime to run. It sleeps until a NOTIFY
for its queue, a freed slot, or the poll interval, whichever comes first, so
it works with polling alone when LISTEN is unavailable.

A queue whose handlers are quick also claims ahead of its free slots, up to a
batch, as many as its slots run in `CLAIM_AHEAD_WAIT` (see `claim_ahead`), so a
claim's round trip overlaps the batch running rather than following it. Jobs
claimed ahead wait in `ready` and start the moment a slot frees; they are
heartbeated like running ones, and handed back (attempt not counted) if the
worker stops before starting them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import asyncpg

from awa.core.model import ClaimDecoder, Job
from awa.core.states import CLAIM_AHEAD_MAX_RUN, CLAIM_AHEAD_WAIT, CLAIM_COALESCE
from awa.core.waiting import wait_signal
from awa.db.lanes import Lanes
from awa.db.pool import HeldConnection
from awa.db.queries import Queries
from awa.telemetry import otel as telemetry
from awa.telemetry import signals
from awa.telemetry.failures import FailureLog
from awa.worker.capacity import Capacity, TokenBucket
from awa.worker.config import QueueConfig
from awa.worker.keyed import KeyedClaims

log = logging.getLogger("awa.dispatcher")
COALESCE_SECONDS = CLAIM_COALESCE.total_seconds()
AHEAD_MAX_RUN_SECONDS = CLAIM_AHEAD_MAX_RUN.total_seconds()
AHEAD_WAIT_SECONDS = CLAIM_AHEAD_WAIT.total_seconds()
RUN_AVERAGE_WEIGHT = 0.1  # of the newest handler run, in the moving average


class Dispatcher:
    """Claims jobs of one queue into free slots."""

    def __init__(self, cfg: QueueConfig, pool: asyncpg.Pool, q: Queries, capacity: Capacity,
                 launch: Callable[[Job], None], poll_interval: float,
                 backlog: Callable[[], bool] = lambda: False,
                 reject: Callable[[int, int, str, int | None], None] = lambda *_: None,
                 lanes: Lanes | None = None) -> None:
        self.cfg = cfg
        self._db: asyncpg.Pool | HeldConnection = pool  # what claims go through
        self._q = q
        self._capacity = capacity
        self._launch = launch
        self._backlogged = backlog
        self._reject = reject
        self._poll = poll_interval
        self._limiter = TokenBucket(cfg.rate_limit) if cfg.rate_limit else None
        self._signal = asyncio.Event()
        self.last_loop_at = time.monotonic()
        self.claimed = 0
        #: Claimed ahead, waiting for a slot (claim order).
        self.ready: deque[Job] = deque()
        self._run_average = 2 * AHEAD_MAX_RUN_SECONDS  # unknown handlers count as slow
        self._stopping: asyncio.Event | None = None
        #: Claimed jobs wait in `ready` instead of starting (see `hold_starts`), and
        #: rows that cannot be decoded wait to be failed (id, lease, error, slot).
        self._starts_held = False
        self._rejects_held: list[tuple[int, int, str, int | None]] = []
        #: Slots taken meanwhile for the first jobs of `ready`, so that queues sharing
        #: slots (weighted) do not claim them too; those jobs start in them.
        self._slots_held = 0
        #: Claims that failed in a row, and the last one's error (health reports them).
        self.claim_failures = 0
        self.last_claim_error: str | None = None
        self._failures = FailureLog(log)
        #: Whether claims must read the ring too (else awa.jobs alone is cheaper):
        #: the runtime's cache, shared by its queues.
        self.lanes = lanes if lanes is not None else Lanes(q)
        #: Per-key concurrency: whether this queue claims with keys (worker/keyed.py).
        self.keys = KeyedClaims(q, cfg.key_max_in_flight is not None, self.lanes)

    def reconfigure(self, cfg: QueueConfig, poll_interval: float) -> None:
        """Run with ``cfg`` and ``poll_interval`` from the next loop on (live overrides)."""
        if cfg.rate_limit != self.cfg.rate_limit:
            self._limiter = TokenBucket(cfg.rate_limit) if cfg.rate_limit else None
        self.cfg = cfg
        self._poll = poll_interval
        self.wake()

    def use_pool(self, pool: asyncpg.Pool, keep_connection: bool = False) -> None:
        """Claim through ``pool`` from now on (the runtime's dedicated claim pool),
        keeping one of its connections between claims if ``keep_connection``."""
        self._db = HeldConnection(pool) if keep_connection else pool

    def _min_batch(self) -> int:
        """Claims of a busy queue wait (once, `CLAIM_COALESCE`) for this many free slots."""
        return min(self.cfg.claim_batch_size, max(1, self._capacity.limit(self.cfg.name) // 4))

    def wake(self) -> None:
        """Claim again now (a NOTIFY arrived, a slot freed, or we are stopping)."""
        self._signal.set()

    def ran(self, seconds: float) -> None:
        """Record how long one handler of this queue ran (decides claiming ahead)."""
        self._run_average += RUN_AVERAGE_WEIGHT * (seconds - self._run_average)

    def hold_starts(self) -> None:
        """Claim, but start no job until `allow_starts`: the worker's start claims
        while the partitions its outcomes land in are still being made."""
        self._starts_held = True

    def allow_starts(self) -> None:
        """Start the jobs claimed meanwhile, and claim on."""
        self._starts_held = False
        rejects, self._rejects_held = self._rejects_held, []
        for reject in rejects:
            self._reject(*reject)
        self._start_ready()
        self._signal.set()

    def slot_freed(self) -> None:
        """A handler of this queue (or, weighted, of any queue) returned."""
        self._start_ready()
        self._signal.set()

    def _start_ready(self, reserved: int = 0) -> None:
        """Start jobs claimed ahead while slots are free, counting ``reserved`` slots
        already taken for jobs in ``ready`` (after those held) as free; while starts
        are held, take their slots only."""
        ready = self.ready
        name = self.cfg.name
        if not ready or self._stopped():
            self._capacity.release(name, reserved)
            return
        # Launching only creates tasks, so the free slots are counted once.
        n = max(0, min(len(ready) - self._slots_held - reserved, self._capacity.free(name)))
        if n > 0:
            self._capacity.acquire(name, n)
        n += reserved
        if self._starts_held:
            self._slots_held += n
            return
        launch = self._launch
        for _ in range(self._slots_held + n):
            launch(ready.popleft())
        self._slots_held = 0

    def _stopped(self) -> bool:
        """The worker is stopping: start nothing more, claim nothing more."""
        return self._stopping is not None and self._stopping.is_set()

    def _ahead(self) -> int:
        """How many jobs to claim beyond the free slots."""
        return claim_ahead(self.cfg.claim_batch_size, self._capacity.limit(self.cfg.name),
                           self._run_average)

    def forget(self, job_id: int) -> bool:
        """Drop a job claimed ahead (cancelled, or rescued elsewhere) before it starts."""
        for i, job in enumerate(self.ready):
            if job.id == job_id:
                del self.ready[i]
                if i < self._slots_held:  # it held a slot (see `_start_ready`)
                    self._slots_held -= 1
                    self._capacity.release(self.cfg.name)
                return True
        return False

    def _take_rows(self, rows: list[asyncpg.Record], keyed: bool = False) -> None:
        """Queue claimed rows to start, decoded by column name (one `ClaimDecoder` per
        batch); one that cannot become a `Job` (a value no writer of ours stores, or a
        column missing) is handed to ``reject`` (id, lease, error, receipt slot) to be failed: it
        must not stop the loop, nor the rest of its batch."""
        decode: ClaimDecoder | None = None
        for row in rows:
            try:
                if decode is None:
                    decode = ClaimDecoder(row.keys(), keyed)
                self.ready.append(decode(row))
            except Exception as exc:
                log.error("claimed job %s of %r cannot be decoded: %r", row["id"],
                          self.cfg.name, exc)
                reject = (row["id"], row["run_lease"], f"claimed row cannot be decoded: {exc!r}",
                          row.get("receipt_slot"))
                if self._starts_held:  # its failure is an outcome too
                    self._rejects_held.append(reject)
                else:
                    self._reject(*reject)

    async def _unclaim(self) -> None:
        """Hand jobs claimed ahead back to the queue: the worker is stopping."""
        jobs, self.ready = list(self.ready), deque()
        if self._slots_held:
            self._capacity.release(self.cfg.name, self._slots_held)
            self._slots_held = 0
        # (id, lease, receipt slot): rows never failed (starts never allowed) go back too.
        back = [(j.id, j.run_lease, j.receipt_slot) for j in jobs]
        back += [(i, lease, slot) for i, lease, _, slot in self._rejects_held]
        self._rejects_held = []
        if not back:
            return
        try:
            ring = [b for b in back if b[2] is not None]
            if ring:  # ring attempts are handed back from the mutable lane
                await self._db.execute(self._q["attempt_materialize"], [b[2] for b in ring],
                                       [b[0] for b in ring], [b[1] for b in ring])
            await self._db.execute(self._q["attempt_unclaim"], [b[0] for b in back],
                                   [b[1] for b in back])
        except Exception as exc:  # they stay running, and rescue re-runs them
            log.warning("could not hand back %d jobs claimed ahead from %r: %r",
                        len(back), self.cfg.name, exc)

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set, then hand back jobs claimed ahead."""
        self._stopping = stopping
        try:
            await self._loop()
        finally:
            try:
                await self._unclaim()
            finally:
                if isinstance(self._db, HeldConnection):
                    await self._db.release()
                signals.emit("stopped", queue=self.cfg.name)

    async def _loop(self) -> None:
        name = self.cfg.name
        coalesced = probe = False
        aging = self.cfg.priority_aging_interval.total_seconds()
        while not self._stopped():
            deadline = self.cfg.deadline.total_seconds()  # re-read: overrides change it
            self.last_loop_at = time.monotonic()
            self._start_ready()
            free = self._capacity.free(name)
            if self._backlogged():
                free = 0  # completions are not being written as fast as jobs finish
            # Jobs held with their slots (see `_start_ready`) are already out of `free`.
            want = min(free + self._ahead() - (len(self.ready) - self._slots_held),
                       self.cfg.claim_batch_size)
            timeout = self._poll
            if 0 < want < self._min_batch() and not coalesced \
                    and self._capacity.in_use(name) > 0:
                coalesced = True  # busy queue: let a few more slots free first, once
                await asyncio.sleep(COALESCE_SECONDS)
                continue
            coalesced = False
            if self._limiter is not None and want > 0:
                want = min(want, self._limiter.available())
                if want == 0:
                    timeout = min(timeout, self._limiter.wait_time())
            if want > 0:
                self._signal.clear()
                # Reserve the free slots before the round trip, so other queues'
                # dispatchers cannot hand out the same shared slots meanwhile.
                reserved = min(want, free)
                self._capacity.acquire(name, reserved)
                kept = 0  # of the reserved slots, those the jobs claimed start in
                try:
                    rows, keyed = await self._claim(want, deadline, aging, probe)
                    got = len(rows) + sum(len(batch) for batch in keyed)
                    if self._limiter is not None:
                        self._limiter.take(got)
                    queued = len(self.ready)
                    self._take_rows(rows)
                    for batch in keyed:  # each statement's rows have columns of their own
                        self._take_rows(batch, keyed=True)
                    # The jobs claimed keep the slots reserved for them: the free slots
                    # may have shrunk meanwhile (a queue sharing them became hungry),
                    # and a job claimed for a slot must not wait without one while that
                    # queue claims the slot again (two weighted queues claimed 5 for 4).
                    kept = min(reserved, len(self.ready) - queued)
                finally:  # the rest, and all of them if cancelled or the loop ends
                    self._capacity.release(name, reserved - kept)
                self._start_ready(kept)
                self.claimed += got
                signals.emit("claim", queue=name, jobs=got)
                # A short plain claim may hide keyed jobs: look for them next round,
                # after the jobs just claimed have started (never holding them back).
                probe = (not probe and not self.keys.active and len(rows) < want
                         and self.keys.probe_due())
                more = got == want or (self.keys.active and self.keys.capped) or probe
                self._capacity.set_hungry(name, more and want >= free)
                if more:
                    continue
            # Always yields, and consumes the signal: a signal set while no slot
            # was free must not spin this loop (Python 3.12+ wait_for would).
            await wait_signal(self._signal, timeout)

    async def _claim(self, want: int, deadline: float, aging: float, probe: bool,
                     ) -> tuple[list[asyncpg.Record], list[list[asyncpg.Record]]]:
        """Claim up to ``want`` jobs: plain rows, or (while keys are in use, or to
        ``probe`` for keyed jobs) one list of rows per keyed statement. A failed
        claim is recorded and returns nothing: whatever the driver raises (a killed
        backend can surface as InternalClientError), the loop must live on and claim
        again later."""
        name = self.cfg.name
        started = time.perf_counter()
        # Rows claimed stay claimed even if a later statement here fails.
        rows: list[asyncpg.Record] = []
        batches: list[list[asyncpg.Record]] = []
        try:
            if self.keys.active or probe:
                batches = await self.keys.claim_batches(self._db, name, want, deadline, aging)
            else:
                claim = "attempt_claim" if await self.lanes.in_use(self._db) \
                    else "attempt_claim_mutable"
                rows = await self._db.fetch(self._q[claim], name, want, deadline, aging)
            telemetry.claim_round(name, time.perf_counter() - started)
            self.claim_failures, self.last_claim_error = 0, None
            self._failures.ok(f"claim from {name!r}")
        except Exception as exc:
            self._failures.failed(f"claim from {name!r}", exc)
            self.claim_failures += 1
            self.last_claim_error = repr(exc)
        return rows, batches


def claim_ahead(batch: int, slots: int, run_average: float) -> int:
    """How many jobs a queue claims beyond its free slots: none for handlers slower
    than `CLAIM_AHEAD_MAX_RUN`, else what its ``slots`` run in `CLAIM_AHEAD_WAIT` at
    ``run_average`` seconds a job, at most ``batch``."""
    if run_average > AHEAD_MAX_RUN_SECONDS:
        return 0
    return min(batch, int(slots * AHEAD_WAIT_SECONDS / max(run_average, 1e-5)))
