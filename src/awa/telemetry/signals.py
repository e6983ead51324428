"""Test signals: events the pipeline and the maintenance services announce, for tests.

A test that must show something does *not* happen ("the job stays scheduled",
"the other job of the key waits") used to sleep and hope the service had run
meanwhile. Instead, the claim loops (``claim``: queue, jobs; ``stopped``: queue),
the completer (``flush``: the batch; ``write``: one outcome) and every periodic
service (``pass``: service, when it started) announce what they did, and the
test awaits the event it needs with a timeout (`Signals.wait`, `Signals.pass_after`).

Nothing listens outside tests: a hook is one call and a None check. A listener
(`listening`) is process-wide and thread-safe, so it hears every client of the
process, the sync client's background loop included.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: The listening test's signals, if any.
hub: Signals | None = None


def emit(name: str, **data: Any) -> None:
    """Announce ``name`` (with ``data``) to the listening test; nothing when none listens."""
    if hub is not None:
        hub.emit(name, data)


@dataclass(frozen=True)
class Signal:
    """One announced event: its name, when (``time.monotonic()``) and what it carries."""

    name: str
    at: float
    data: dict[str, Any] = field(default_factory=dict)


class Signals:
    """Every event announced while listening, and the tasks waiting for one."""

    def __init__(self) -> None:
        self.history: list[Signal] = []
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def emit(self, name: str, data: dict[str, Any]) -> None:
        """Record an event and wake every waiter (each re-reads the history)."""
        with self._lock:
            self.history.append(Signal(name, time.monotonic(), data))
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the waiter's loop is closed: nobody waits any more
                pass

    def mark(self) -> int:
        """A position in the history: `wait` ``since`` it sees only later events."""
        with self._lock:
            return len(self.history)

    async def wait(self, name: str | tuple[str, ...], *, since: int | None = None, count: int = 1,
                   timeout: float = 15.0, where: Callable[[Signal], bool] | None = None,
                   **match: Any) -> Signal:
        """Wait for the ``count``-th event ``name`` (or any of several names) announced
        after ``since`` (default: now) whose data has the values in ``match`` and passes
        ``where``; returns it. Fails the test (AssertionError) after ``timeout`` seconds."""
        names = (name,) if isinstance(name, str) else name
        loop = asyncio.get_running_loop()
        seen = self.mark() if since is None else since
        found = 0
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                new, seen = self.history[seen:], len(self.history)
                for sig in new:
                    if sig.name in names and all(sig.data.get(k) == v for k, v in match.items()) \
                            and (where is None or where(sig)):
                        found += 1
                        if found >= count:
                            return sig
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            remaining = deadline - loop.time()
            if remaining <= 0:
                heard = sorted({s.name for s in self.history})
                raise AssertionError(f"timed out after {timeout}s waiting for {count} "
                                     f"{name!r} signal(s) {match or ''}; heard: {heard}")
            try:
                async with asyncio.timeout(remaining):
                    await future
            except TimeoutError:
                pass

    async def pass_after(self, service: str, *, count: int = 1, after: float | None = None,
                         timeout: float = 15.0) -> Signal:
        """Wait until service ``service`` has run ``count`` whole passes that began after
        ``after`` (a ``time.monotonic()``; default: now)."""
        begun = time.monotonic() if after is None else after
        return await self.wait("pass", service=service, count=count, timeout=timeout,
                               since=0, where=lambda s: s.data["started"] >= begun)

    async def outcome(self, job_id: int, *, since: int = 0, timeout: float = 15.0) -> Signal:
        """Wait until the completer has dealt with an outcome of job ``job_id`` announced
        after ``since`` (default: since listening began): flushed its completion (written,
        stale or given up) or written its other outcome."""
        def about(sig: Signal) -> bool:
            return sig.data.get("job") == job_id or any(
                i == job_id for i, _ in sig.data.get("batch", ()))
        return await self.wait(("flush", "write"), since=since, timeout=timeout, where=about)

    async def claims(self, queue: str, count: int = 1, timeout: float = 15.0) -> Signal:
        """Wait until the claim loop of ``queue`` has claimed ``count`` more times (each
        claim round counts, an empty one too)."""
        return await self.wait("claim", queue=queue, count=count, timeout=timeout)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@contextmanager
def listening() -> Iterator[Signals]:
    """Listen for the duration of the block (a test): `emit` records from now on."""
    global hub
    hub = Signals()
    try:
        yield hub
    finally:
        hub = None
