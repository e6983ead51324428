"""Presence: each worker process keeps a row in ``awa.runtime_instances``.

The web UI's runtime page and ``awa`` operators read it to see which
processes are alive, what they serve and which one leads maintenance.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from awa.core.version import __version__
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService

#: How often a worker refreshes its row.
PRESENCE_INTERVAL = timedelta(seconds=2)
#: A row not refreshed for this many intervals is shown as stale.
STALE_AFTER_INTERVALS = 3


class Presence(PeriodicService):
    """Upserts this process's row every ``interval``; removes it at shutdown."""

    name = "presence"
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta, instance_id: str,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        super().__init__(pool, q, interval)
        self._instance_id = instance_id
        self._snapshot = snapshot
        self._started_at = datetime.now(UTC)

    async def run_once(self) -> None:
        s = self._snapshot()
        await self._pool.execute(
            self._q["presence_upsert"], self._instance_id, socket.gethostname(), os.getpid(),
            __version__, self._started_at, s["is_leader"], s["listening"], s["in_flight"],
            s["claimed"], s["completed"], json.dumps(s["queues"]))
        if self.runs % 60 == 0:
            await self._pool.execute(self._q["presence_prune"])
            await self._pool.execute(self._q["descriptor_prune"])

    async def prepare(self) -> None:
        """On the runtime page (and descriptors live) as soon as start() returns."""
        await self.run_once()

    async def remove(self) -> None:
        """Say goodbye at shutdown, so the process leaves the runtime page at once."""
        await self._pool.execute(self._q["presence_remove"], self._instance_id)
