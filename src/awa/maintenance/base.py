"""The one shape of every background service."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core.waiting import wait_event
from awa.db.queries import Queries
from awa.telemetry import signals
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.maintenance")
_failures = FailureLog(log)


def _always() -> bool:
    return True


class PeriodicService(ABC):
    """Runs `run_once` every ``interval`` (with jitter), optionally only when leading.

    The base holds what every service works with: the pool (``self._pool``,
    replaced by `use_pool`) and the named statements (``self._q``).
    """

    name = "service"
    leader_only = True
    #: Whether the worker's first job waits for `prepare` (else only ``start()`` does).
    before_jobs = False
    #: Whether this service's loop, like a job, waits for the `before_jobs`
    #: preparations at start: every loop that may write an outcome (a row of
    #: awa.jobs_done) must. The heartbeat (of the jobs claimed meanwhile) and the
    #: overrides (which the first claims should see) do not.
    waits_for_partitions = True

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool] = _always) -> None:
        self._pool: Any = pool  # an asyncpg.Pool, or the runtime's own (`use_pool`)
        self._q = q
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
        """What this process needs done before ``start()`` returns, leader or not, and
        before its first job starts where `before_jobs` (default: nothing)."""
        return None

    def _sleep_for(self) -> float:
        return self.interval * random.uniform(0.9, 1.1)

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set; a failing pass is logged, never fatal."""
        while not stopping.is_set():
            if not self.leader_only or self._is_leader():
                started = time.monotonic()
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
                signals.emit("pass", service=self.name, started=started)
            await wait_event(stopping, self._sleep_for())



def lost_connection(exc: BaseException) -> bool:
    """The database is out of reach (not one job's fault): the whole pass fails. A
    statement timeout (TimeoutError, an OSError) may be one job's fault: not lost."""
    if isinstance(exc, TimeoutError):
        return False
    return isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.InterfaceError
                      | ConnectionError | OSError) or (
        isinstance(exc, asyncpg.PostgresError)
        and getattr(exc, "sqlstate", "").startswith(("08", "57P")))


class Quarantine:
    """Jobs one statement of a pass failed on when it ran for them alone.

    A statement that acts on every due job (rescue, promotion) fails as a whole
    when it fails for one of them (a trigger error, a statement timeout on
    one job's cascade): without this, one bad job stopped the pass for every
    other job on every pass. `run` takes such a statement; when it fails
    (anything but a lost connection), each due job is tried alone, and those
    that still fail are quarantined: left out of the batch from then on and
    tried alone again at the start of each pass, so they leave as soon as
    their statement works (or they are no longer due).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.ids: set[int] = set()
        self.failed = 0  #: single-job failures so far

    async def run(self, batch: Callable[[list[int] | None, list[int]], Awaitable[int]],
                  due: Callable[[list[int]], Awaitable[Sequence[int]]], limit: int) -> None:
        """``batch(only, never)`` acts on the due jobs among ``only`` (None: any), none
        of ``never``, at most ``limit`` of them, and returns how many it acted on;
        ``due(never)`` lists the jobs it would act on."""
        for job_id in sorted(self.ids):
            if await self._alone(batch, job_id):
                self.ids.discard(job_id)
        while True:
            try:
                n = await batch(None, sorted(self.ids))
            except Exception as exc:
                if lost_connection(exc):
                    raise
                before = len(self.ids)
                for job_id in await due(sorted(self.ids)):
                    if not await self._alone(batch, job_id):
                        self.ids.add(job_id)
                if len(self.ids) == before:  # no job to blame: the statement itself fails
                    raise
                continue  # the rest, without the ones now quarantined
            if n < limit:
                return

    async def _alone(self, batch: Callable[[list[int] | None, list[int]], Awaitable[int]],
                     job_id: int) -> bool:
        try:
            await batch([job_id], [])
        except Exception as exc:
            if lost_connection(exc):
                raise
            self.failed += 1
            _failures.failed(f"{self.what} of job {job_id}", exc)
            return False
        _failures.ok(f"{self.what} of job {job_id}")
        return True
