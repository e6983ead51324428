"""Presence: each worker process says what it is in ``awa.presence_beats``.

The web UI's runtime page and ``awa`` operators read the latest row of each
process (the view ``awa.presence``) to see which processes are alive, what
they serve and which one leads maintenance; `snapshot` is what a row says,
read from the runtime's parts. Rows are only ever inserted; old ones go by
TRUNCATE of a spent partition (migration 0028), which a long transaction
does not hold back.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from awa.core.version import __version__
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.maintenance.leader import LeaderElection
from awa.worker.attempts import Attempts
from awa.worker.capacity import Capacity
from awa.worker.completion import Completer
from awa.worker.dispatcher import Dispatcher

#: How often a worker refreshes its row.
PRESENCE_INTERVAL = timedelta(seconds=2)
#: A row not refreshed for this many intervals is shown as stale.
STALE_AFTER_INTERVALS = 3
#: Every this many intervals a process tries to empty the records' spent partitions.
TIDY_EVERY = 30


def snapshot(leader: LeaderElection, listening: bool, attempts: Attempts,
             dispatchers: Mapping[str, Dispatcher], completer: Completer,
             capacity: Capacity) -> dict[str, Any]:
    """This process as its presence row shows it: leadership, LISTEN, and per queue
    its slots and handlers in flight."""
    in_flight = attempts.per_queue()
    return {"is_leader": leader.is_leader, "listening": listening,
            "in_flight": len(attempts),
            "claimed": sum(d.claimed for d in dispatchers.values()),
            "completed": completer.completed,
            "queues": {n: {"max_workers": capacity.limit(n), "in_flight": in_flight[n]}
                       for n in dispatchers}}


class Presence(PeriodicService):
    """Appends this process's row every ``interval``; says goodbye at shutdown."""

    name = "presence"
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta, instance_id: str,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        super().__init__(pool, q, interval)
        self._instance_id = instance_id
        self._snapshot = snapshot
        self._started_at = datetime.now(UTC)

    def _identity(self) -> tuple[str, str, int, str, datetime]:
        return (self._instance_id, socket.gethostname(), os.getpid(), __version__,
                self._started_at)

    async def run_once(self) -> None:
        s = self._snapshot()
        await self._pool.execute(
            self._q["presence_beat"], *self._identity(), s["is_leader"], s["listening"],
            s["in_flight"], s["claimed"], s["completed"], json.dumps(s["queues"]))
        if self.runs % TIDY_EVERY == 0:
            await self._pool.execute(self._q["presence_tidy"])
        if self.runs % 60 == 0:
            await self._pool.execute(self._q["presence_prune"])
            await self._pool.execute(self._q["descriptor_prune"])

    async def prepare(self) -> None:
        """On the runtime page (and descriptors live) as soon as start() returns."""
        await self.run_once()

    async def remove(self) -> None:
        """Say goodbye at shutdown, so the process leaves the runtime page at once."""
        await self._pool.execute(self._q["presence_remove"], *self._identity())
