"""Lanes in use: whether a database's append-only lane takes or holds jobs, cached.

Migration 0020's ring is switched on per database (``awa.ring.enqueue``). Where
it is off and has never held a job, the statements of the mutable lane alone
are the cheaper ones (a single insert without routing, a claim without the
ring's walk), so producers and workers read the switch through this cache. A
stale answer only costs time, never a job: the claim reads both lanes whenever
the ring has held anything, and a job inserted into awa.jobs by a producer that
has not seen the switch yet is claimed as any other.
"""

from __future__ import annotations

import time

import asyncpg

from awa.db.pool import Conn, HeldConnection
from awa.db.queries import Queries

#: Whatever runs a statement: a connection, a pool, or a held connection.
Db = Conn | asyncpg.Pool | HeldConnection

#: How long an answer is reused. A switch takes at most this long to reach a
#: process; meanwhile its jobs go where they went, and nothing waits.
LANES_TTL = 5.0


class Lanes:
    """The cached answers of ``ring_lanes_state`` for one schema."""

    __slots__ = ("_at", "_enqueue", "_in_use", "_q")

    def __init__(self, q: Queries) -> None:
        self._q = q
        self._at = -LANES_TTL
        self._enqueue = False
        self._in_use = True  # until read: the claim over both lanes is always right

    async def _refresh(self, db: Db) -> None:
        if time.monotonic() - self._at < LANES_TTL:
            return
        (row,) = await db.fetch(self._q["ring_lanes_state"])  # the ring's one row
        self._enqueue, self._in_use = bool(row["enqueue"]), bool(row["in_use"])
        self._at = time.monotonic()

    async def enqueue(self, db: Db) -> bool:
        """Whether plain jobs go to the ring (``awa.ring.enqueue``)."""
        await self._refresh(db)
        return self._enqueue

    async def in_use(self, db: Db) -> bool:
        """Whether the ring takes jobs or has ever held one: claims must read it."""
        await self._refresh(db)
        return self._in_use
