"""Awaitable results: wait until a job finishes and read its final state and output.

`ResultWaiter` is a client's one place for every ``wait_for`` in flight:

- **Registration.** A waiter adds its job to ``awa.job_waiters`` and marks the
  job (``metadata._awa_waited``: its finished row wakes the waiters; marking
  locks the row, so its finish cannot slip past; migrations 0012, 0018),
  then reads the job once: it may already be finished.
- **Wake-ups.** Only finishes of registered jobs send ``NOTIFY awa_result``
  (payload: the job id), so jobs nobody waits on cost no NOTIFY. One LISTEN
  connection per client receives them (`awa.db.listener.Listener`, the same
  probing and reconnecting as the worker's); a notification is only a hint
  to re-read the job, so one meant for another schema's job of the same id
  costs a read and nothing else. After every (re)connect, every waiter
  re-reads its job, which covers what was sent while disconnected.
- **Polling.** One task per client asks, for all the jobs waited on at once,
  which ones left the active table: every `RESULT_POLL_INTERVAL` while LISTEN
  is unavailable (behind a transaction pooler such as PgBouncer), every
  `RESULT_SAFETY_POLL` while it works. ``poll_interval=`` shortens it.

A finished job is read from ``awa.jobs_all`` (active, finished and
dead-lettered rows), where it stays for its state's retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

import asyncpg

from awa.core import states
from awa.core.errors import JobNotFound, ValidationError, WaitTimeout
from awa.core.model import Job
from awa.core.validate import check_id, check_seconds
from awa.core.waiting import wait_event, wait_signal
from awa.db.errors import translated
from awa.db.listener import Listener
from awa.db.queries import Queries

log = logging.getLogger("awa.results")
RESULT_DB_GRACE_SECONDS = states.RESULT_DB_GRACE.total_seconds()
CHANNEL = "awa_result"


class ResultWaiter:
    """Waits for jobs to finish, for one client (pool, schema, URL)."""

    def __init__(self, pool: asyncpg.Pool, q: Queries, url: str) -> None:
        self._pool, self._q = pool, q
        self._listener = Listener(url, q, states.RESULT_POLL_INTERVAL.total_seconds(),
                                  self._on_notify, self._wake_all, channels=(CHANNEL,))
        self._events: dict[int, set[asyncio.Event]] = {}
        self._intervals: dict[asyncio.Event, float] = {}  # explicit poll_interval= per wait
        self._kick = asyncio.Event()  # a shorter poll interval arrived
        self._sleeping = 0.0  # the interval the poll task is waiting out now
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def listening(self) -> bool:
        """Whether finishes arrive by NOTIFY right now (else only the poll finds them)."""
        return self._listener.listening

    async def wait_for(self, job_id: int, timeout: float | None = None,
                       poll_interval: float | None = None) -> Job:
        """Wait until job ``job_id`` is completed, failed (dead-lettered included) or
        cancelled, and return it; `WaitTimeout` after ``timeout`` seconds (None:
        no limit), `JobNotFound` if no such job exists (or it was already pruned)."""
        check_id("job_id", job_id)
        if timeout is not None:
            timeout = check_seconds("timeout", timeout)
        if poll_interval is not None and check_seconds("poll_interval", poll_interval) <= 0:
            raise ValidationError("poll_interval", "must be > 0 seconds")
        self._start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        expires = None if timeout is None else datetime.now(UTC) + timedelta(seconds=timeout)
        event = asyncio.Event()
        self._events.setdefault(job_id, set()).add(event)  # before registering: no lost wake
        if poll_interval is not None:
            self._intervals[event] = poll_interval
        if self._interval() < self._sleeping:
            self._kick.set()  # the poll task sleeps a longer interval than this waiter wants
        state: str | None = None
        timed_out = False
        try:
            registered = False
            # The deadline holds for the database calls too: a wait outlives its
            # timeout by at most states.RESULT_DB_GRACE (time for the calls a timeout of 0
            # still makes), whatever hangs (a row lock, a pool or pooler with no
            # free connection).
            bound = None if deadline is None else deadline + RESULT_DB_GRACE_SECONDS
            async with asyncio.timeout_at(bound):
                while True:
                    if not registered:
                        with translated():
                            # A ring job moves to awa.jobs first (its own
                            # statement), where registering marks it.
                            await self._pool.fetchval(self._q["job_ring_to_mutable"], [job_id])
                            registered = await self._pool.fetchval(
                                self._q["result_register"], job_id, expires) is not None
                    job = await self._read(job_id)
                    if job is None:
                        raise JobNotFound(f"no job with id {job_id}")
                    if job.state in states.TERMINAL:
                        return job
                    state = str(job.state)
                    if not registered:
                        continue  # active again (an admin retry) but not registered: register
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        timed_out = True
                        raise WaitTimeout(job_id, timeout or 0.0, state)
                    if not await wait_signal(event, remaining):
                        timed_out = True
                        raise WaitTimeout(job_id, timeout or 0.0, state)
        except WaitTimeout:
            raise
        except TimeoutError:
            timed_out = True
            raise WaitTimeout(job_id, timeout or 0.0, state) from None
        finally:
            self._forget(job_id, event)
            # A finish deletes the registration itself. A waiter whose deadline
            # passed drops it unless another waiter's deadline is later; one
            # that gave up early (cancelled) leaves it: the row holds only the
            # latest deadline, so another waiter on the job may still need it.
            # It lapses at that deadline (cleanup prunes it), or goes with the job.
            if timed_out:
                with contextlib.suppress(Exception):
                    await self._pool.execute(self._q["result_unregister"], job_id, expires)

    async def close(self) -> None:
        """Stop listening and polling (waits in flight see their tasks cancelled)."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self._listener.close()

    # -- internals -------------------------------------------------------------------

    def _start(self) -> None:
        if not self._tasks and not self._stopping.is_set():
            self._tasks = [asyncio.create_task(self._listener.run(self._stopping),
                                               name="awa-results-listen"),
                           asyncio.create_task(self._poll(), name="awa-results-poll")]

    async def _read(self, job_id: int) -> Job | None:
        with translated():
            row = await self._pool.fetchrow(self._q["job_get"], job_id)
        return None if row is None else Job.from_row(row)

    def _forget(self, job_id: int, event: asyncio.Event) -> None:
        self._intervals.pop(event, None)
        waiting = self._events.get(job_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._events[job_id]

    def _wake(self, job_id: int) -> None:
        for event in self._events.get(job_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for job_id in list(self._events):
            self._wake(job_id)

    def _on_notify(self, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            self._wake(int(payload))

    def _interval(self) -> float:
        """The shortest poll interval any waiter wants (its own, else the default)."""
        default = (states.RESULT_SAFETY_POLL if self.listening
                   else states.RESULT_POLL_INTERVAL).total_seconds()
        explicit = self._intervals.values()
        if len(self._intervals) < sum(len(e) for e in self._events.values()):
            return min([default, *explicit])  # some waiter uses the default
        return min(explicit, default=default)

    async def _poll(self) -> None:
        """Wake the waiters whose job left the active table: one query for all of them."""
        while not self._stopping.is_set():
            self._kick.clear()
            self._sleeping = self._interval()
            try:
                if await wait_event(self._kick, self._sleeping):
                    continue  # a shorter interval arrived: wait again with it
            finally:
                self._sleeping = 0.0
            ids = list(self._events)
            if not ids:
                continue
            try:
                rows = await self._pool.fetch(self._q["result_not_active"], ids)
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
                log.warning("polling for job results failed: %s", exc)
                continue
            for row in rows:
                self._wake(row["id"])

