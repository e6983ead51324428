"""Heartbeat: keeps this process's running attempts alive, and their progress saved.

A periodic service of every worker process (not only the leader): one
statement refreshes every running attempt's heartbeat under its run lease,
writing any progress checkpoint its handler recorded; an attempt the
database no longer holds for this lease (rescued, cancelled) is reported lost.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import asyncpg

from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.worker.context import AttemptControl, JobContext

#: What the heartbeat is given of each live attempt: job id, run lease, handler
#: context (None for jobs claimed ahead and unwritten completions) and receipt
#: slot (a ring attempt's, `Job.receipt_slot`; None in the mutable lane).
LiveAttempt = tuple[int, int, JobContext | None, int | None]


class Heartbeat(PeriodicService):
    """Refreshes this process's running attempts; reports the ones it lost."""

    name = "heartbeat"
    waits_for_partitions = False
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 attempts: Callable[[], list[LiveAttempt]],
                 lost: Callable[[int], None]) -> None:
        super().__init__(pool, q, interval)
        self._attempts = attempts
        self._lost = lost

    def _sleep_for(self) -> float:
        return self.interval  # no jitter: staleness is measured against it

    async def run_once(self) -> None:
        attempts = self._attempts()
        if not attempts:
            return
        progress = [AttemptControl(ctx).take_progress() if ctx is not None else None
                    for _, _, ctx, _ in attempts]
        slots = [slot for _, _, _, slot in attempts]
        try:
            await self._to_mutable_lane(attempts, progress, slots)
            rows = await self._pool.fetch(self._q["attempt_heartbeat"],
                                          [a[0] for a in attempts], [a[1] for a in attempts],
                                          progress, slots)
        except BaseException:
            for (_, _, ctx, _), text in zip(attempts, progress, strict=True):
                if ctx is not None and text is not None:
                    AttemptControl(ctx).restore_progress()
            raise
        written = {r["id"]: r["written"] for r in rows}
        for (job_id, _, ctx, _), text in zip(attempts, progress, strict=True):
            if job_id not in written:
                self._lost(job_id)
            elif not written[job_id] and ctx is not None and text is not None:
                # The row was busy this beat: write the progress next time.
                AttemptControl(ctx).restore_progress()

    async def _to_mutable_lane(self, attempts: list[LiveAttempt], progress: list[str | None],
                               slots: list[int | None]) -> None:
        """Ring attempts with progress to write move to the mutable lane first (the
        ring keeps no progress); ``slots`` is updated to match."""
        moving = [i for i, (slot, text) in enumerate(zip(slots, progress, strict=True))
                  if slot is not None and text is not None]
        if not moving:
            return
        await self._pool.execute(self._q["attempt_materialize"],
                                 [slots[i] for i in moving], [attempts[i][0] for i in moving],
                                 [attempts[i][1] for i in moving])
        for i in moving:
            slots[i] = None
            ctx = attempts[i][2]
            if ctx is not None:
                AttemptControl(ctx).moved()
