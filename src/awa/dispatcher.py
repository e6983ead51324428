"""Dispatcher: one claim loop per queue.

Second stop of the pipeline (Postgres → dispatcher → executor). It claims as
many jobs as the queue has free slots (capped by the claim batch size and the
rate limit) and hands each to the runtime to run. It sleeps until a NOTIFY
for its queue, a freed slot, or the poll interval, whichever comes first, so
it works with polling alone when LISTEN is unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg

from awa import telemetry
from awa.capacity import Capacity, TokenBucket
from awa.config import QueueConfig
from awa.db.queries import Queries
from awa.model import Job
from awa.states import CLAIM_COALESCE

log = logging.getLogger("awa.dispatcher")
COALESCE_SECONDS = CLAIM_COALESCE.total_seconds()


class Dispatcher:
    """Claims jobs of one queue into free slots."""

    def __init__(self, cfg: QueueConfig, pool: asyncpg.Pool, q: Queries, capacity: Capacity,
                 launch: Callable[[Job], None], poll_interval: float,
                 backlog: Callable[[], bool] = lambda: False) -> None:
        self.cfg = cfg
        self._pool = pool
        self._q = q
        self._capacity = capacity
        self._launch = launch
        self._backlogged = backlog
        self._poll = poll_interval
        self._limiter = TokenBucket(cfg.rate_limit) if cfg.rate_limit else None
        self._signal = asyncio.Event()
        self.last_loop_at = time.monotonic()
        self.claimed = 0

    def reconfigure(self, cfg: QueueConfig, poll_interval: float) -> None:
        """Run with ``cfg`` and ``poll_interval`` from the next loop on (live overrides)."""
        if cfg.rate_limit != self.cfg.rate_limit:
            self._limiter = TokenBucket(cfg.rate_limit) if cfg.rate_limit else None
        self.cfg = cfg
        self._poll = poll_interval
        self.wake()

    def use_pool(self, pool: asyncpg.Pool) -> None:
        """Claim through ``pool`` from now on (the runtime's dedicated claim pool)."""
        self._pool = pool

    def _min_batch(self) -> int:
        """Claims of a busy queue wait (once, `CLAIM_COALESCE`) for this many free slots."""
        return min(self.cfg.claim_batch_size, max(1, self._capacity.limit(self.cfg.name) // 4))

    def wake(self) -> None:
        """Claim again now (a NOTIFY arrived, a slot freed, or we are stopping)."""
        self._signal.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set."""
        name = self.cfg.name
        coalesced = False
        aging = self.cfg.priority_aging_interval.total_seconds()
        while not stopping.is_set():
            deadline = self.cfg.deadline.total_seconds()  # re-read: overrides change it
            self.last_loop_at = time.monotonic()
            free = self._capacity.free(name)
            if self._backlogged():
                free = 0  # completions are not being written as fast as jobs finish
            want = min(free, self.cfg.claim_batch_size)
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
                # Reserve the slots before the round trip, so other queues'
                # dispatchers cannot hand out the same shared slots meanwhile.
                self._capacity.acquire(name, want)
                started = time.perf_counter()
                try:
                    rows = await self._pool.fetch(self._q["attempt_claim"], name, want,
                                                  deadline, aging)
                    telemetry.claim_round(name, time.perf_counter() - started)
                except Exception as exc:
                    # Whatever the driver raises (a killed backend can surface as
                    # InternalClientError), this loop must live on: claim again later.
                    log.warning("claim from %r failed: %r", name, exc)
                    rows = []
                finally:
                    self._capacity.release(name, want)
                if self._limiter is not None:
                    self._limiter.take(len(rows))
                for row in rows:
                    self._capacity.acquire(name)
                    self._launch(Job.from_row(row))
                self.claimed += len(rows)
                more = len(rows) == want
                self._capacity.set_hungry(name, more and want == free)
                if more:
                    continue
            try:
                await asyncio.wait_for(self._signal.wait(), timeout)
            except TimeoutError:
                pass
