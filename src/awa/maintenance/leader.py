"""Leader election through a lease (works behind transaction poolers).

Each process tries every third of the election interval; the holder renews,
and a dead leader's lease expires within one election interval. Each take
or renewal appends a term row (`awa.leader_take`, migration 0028), so a held
xmin horizon keeps no dead versions of the lease.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import asyncpg

from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService

log = logging.getLogger("awa.maintenance.leader")


class LeaderElection(PeriodicService):
    name = "leader"
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, instance_id: str,
                 election_interval: timedelta) -> None:
        super().__init__(pool, q, election_interval / 3)
        self.instance_id = instance_id
        self._ttl = election_interval
        self.is_leader = False

    async def run_once(self) -> None:
        try:
            won = await self._pool.fetchval(self._q["leader_acquire"], self.instance_id,
                                            self._ttl)
        except Exception:
            self.is_leader = False
            raise
        was, self.is_leader = self.is_leader, bool(won)
        if self.is_leader != was:
            log.info("%s leadership (%s)", "took" if self.is_leader else "lost",
                     self.instance_id)

    async def resign(self) -> None:
        if self.is_leader:
            self.is_leader = False
            await self._pool.execute(self._q["leader_release"], self.instance_id)
