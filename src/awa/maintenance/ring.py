"""Ring upkeep: moves the append-only lane's ring on and reclaims spent slots.

The append-only lane (migration 0020, docs/storage.md) only ever inserts; its
tables are partitioned into a ring of slots, and this leader-only service
keeps the ring turning: every pass it moves new writes into the next slot if
that one is empty, then truncates each table of the older slots whose rows
are all spent, oldest slot first, each in a transaction of its own with a
short lock timeout (a table that one transaction has held since the previous
pass is not asked for until it lets go). TRUNCATE frees space without waiting for the xmin horizon,
so a long transaction elsewhere cannot make this lane's rows pile up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta

import asyncpg

from awa.core.states import RING_RECLAIM_LOCK_TIMEOUT
from awa.core.waiting import wait_event
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService

log = logging.getLogger("awa.maintenance")
#: The order a slot's tables are reclaimed in: each waits for the ones before
#: (the cancels of ready rows go once the ready rows are, receipts once the
#: ready rows they were claimed from are, closures and heartbeats once the
#: slot's receipts are).
FAMILIES = ("ready", "ready_cancels", "receipts", "closures", "heartbeats", "claim_log")
#: Tries per table and pass, and the pause between them (each waits for the
#: lock at most RING_RECLAIM_LOCK_TIMEOUT).
RECLAIM_ATTEMPTS = 5
RECLAIM_RETRY_SECONDS = 1.0
#: After a turn, the pauses before looking again at the slot just left while
#: it holds rows: the reclaim leaves it alone while attempts claimed in it are
#: open (migration 0029), and those in flight at the turn mostly end within a
#: moment. Without a second look it waited a whole pass, and the ring held two
#: slots' rows for half of each minute (bench/soak.py at 12,000 jobs/s), which
#: every count and scan of the ring then read. All within the 10 s after a
#: turn that the reclaim leaves the slot alone for (migration 0032).
SETTLE_SECONDS = (1.0, 2.0, 4.0)


class RingKeeper(PeriodicService):
    """Moves the ring on and truncates its spent slots (leader only)."""

    name = "ring"

    #: Tries per table and pass, and the pause between them.
    attempts = RECLAIM_ATTEMPTS
    retry_seconds = RECLAIM_RETRY_SECONDS
    #: Pauses before the looks again at the slot just left, after a turn.
    settle_seconds = SETTLE_SECONDS

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool]) -> None:
        super().__init__(pool, q, interval, is_leader)
        self.truncated = 0
        self.advanced = 0
        #: Tables left alone in a pass because a long transaction held them.
        self.deferred = 0
        self._holders: set[tuple[str, str]] = set()
        self._reported: set[str] = set()
        #: Whether the last reclaim left rows in the slot just before the current one.
        self.left_held = False
        self._stopping = asyncio.Event()

    async def run(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping  # the pauses below end early on shutdown
        await super().run(stopping)

    async def run_once(self) -> None:
        turned = await self._pool.fetchval(self._q["ring_advance"]) is not None
        if turned:
            self.advanced += 1
        await self.reclaim()
        for pause in self.settle_seconds if turned else ():
            if not self.left_held or await wait_event(self._stopping, pause):
                break
            await self.reclaim()

    async def reclaim(self) -> int:
        """Truncate what is spent in every slot but the current one; how many tables."""
        rows = await self._pool.fetch(self._q["ring_state"])
        self.left_held = False
        if not rows:
            return 0
        current, slots = rows[0]["current"], rows[0]["slots"]
        held = {(r["family"], r["slot"]) for r in rows if r["slot"] != current}
        left = (current - 1) % slots
        # Oldest first: the slots after the current one, in ring order.
        order = sorted(held, key=lambda fs: ((fs[1] - current) % slots,
                                             FAMILIES.index(fs[0])))
        long_held = await self._long_held()
        done = 0
        for family, slot in order:
            if f"{family}_{slot}" in long_held:
                self.deferred += 1
                continue
            if await self._reclaim_one(family, slot):
                done += 1
            elif slot == left:
                self.left_held = True
        self.truncated += done
        return done

    async def _long_held(self) -> set[str]:
        """The ring's tables that one transaction has held since the previous pass.

        Asking for such a table's lock cannot succeed while that transaction
        lasts (a report, or the harness's active readers, counting the ring),
        and every ask queues claims and completions behind it until the lock
        timeout: so they are not asked for until the holder has gone."""
        rows = await self._pool.fetch(self._q["ring_lock_holders"])
        holders = {(r["name"], r["holder"]) for r in rows}
        long_held = {name for name, _ in holders & self._holders}
        if long_held - self._reported:
            log.info("ring tables held by a long transaction, left until it ends: %s",
                     ", ".join(sorted(long_held - self._reported)))
        self._holders, self._reported = holders, long_held
        return long_held

    async def _reclaim_one(self, family: str, slot: int) -> bool:
        """One table, in its own transaction; False if not spent or not lockable now.

        A busy table is tried again a few times in the pass: a reader that keeps
        the lock for a second (a count over the ring) must not make the ring
        wait a whole pass, or the ring grows and that reader gets slower."""
        timeout = f"{int(RING_RECLAIM_LOCK_TIMEOUT.total_seconds() * 1000)}ms"
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.retry_seconds)
            async with self._pool.acquire() as conn:
                try:
                    async with conn.transaction():
                        await conn.execute(self._q["tx_lock_timeout"], timeout)
                        return bool(await conn.fetchval(self._q["ring_reclaim"], family, slot))
                except asyncpg.LockNotAvailableError:
                    continue
        log.debug("ring slot %d's %s is busy; left for the next pass", slot, family)
        return False
