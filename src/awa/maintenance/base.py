"""The one shape of every background service."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from awa.core.waiting import wait_event
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.maintenance")
_failures = FailureLog(log)


class PeriodicService(ABC):
    """Runs `run_once` every ``interval`` (with jitter), optionally only when leading."""

    name = "service"
    leader_only = True

    def __init__(self, interval: timedelta, is_leader: Callable[[], bool]) -> None:
        self.interval = interval.total_seconds()
        self._is_leader = is_leader
        self.last_run_at: float | None = None
        self.runs = 0
        self.failures = 0

    def use_pool(self, pool: Any) -> None:
        """Run on ``pool`` from now on (the runtime's own pool, see `Runtime.start`)."""
        self._pool = pool

    @abstractmethod
    async def run_once(self) -> None:
        """One pass of work."""

    async def prepare(self) -> None:
        """What this process needs done before it claims, leader or not (default: nothing)."""
        return None

    def _sleep_for(self) -> float:
        return self.interval * random.uniform(0.9, 1.1)

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set; a failing pass is logged, never fatal."""
        while not stopping.is_set():
            if not self.leader_only or self._is_leader():
                try:
                    await self.run_once()
                    self.runs += 1
                    _failures.ok(f"{self.name} pass")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.failures += 1
                    _failures.failed(f"{self.name} pass", exc)
                self.last_run_at = time.monotonic()
            await wait_event(stopping, self._sleep_for())
