"""Repeated failures logged once, not once per retry: an outage stays readable.

While the database is down, every claim loop, maintenance service and
completion retry fails again and again. `FailureLog` writes the first failure
of a subsystem with its traceback, then at most one line per `REPEAT_EVERY`
with the count and the latest error (no traceback), and one line when it works
again. A lost database (refused, closed or shutting-down connections: see
`unreachable`) is one line even the first time, with no traceback and a word on
what it means: the same traceback from ten subsystems tells nobody anything.
The counters the health checks read are kept by their owners, unchanged.
"""

from __future__ import annotations

import logging
import time

import asyncpg

#: The shortest gap between two log lines about the same ongoing failure.
REPEAT_EVERY = 30.0


#: What a lost database's first line adds: what happened, and what Awa does about it.
UNREACHABLE_HINT = ("the database is unreachable (stopped, restarting, or stopped by another "
                    "process?); retrying, a line every 30 s until it answers")

#: `asyncpg.InternalClientError` is here because a connection the server ends
#: between two statements (a shutdown) leaves asyncpg waiting for the rest of
#: the server's goodbye; the next statement on it fails with "cannot switch to
#: state ...; another operation is in progress" rather than a connection error.
_LOST = (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError,
         asyncpg.InterfaceError, asyncpg.InternalClientError)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says the database cannot be reached: refused
    or dropped connections, a server shutting down. A timeout is not one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TimeoutError):
            return False
        if isinstance(current, (OSError, *_LOST)):
            return True
        current = current.__cause__
    return False


class FailureLog:
    """Per-subsystem failure state for one logger (a service, a queue's claims...)."""

    def __init__(self, log: logging.Logger, repeat_every: float = REPEAT_EVERY) -> None:
        self._log = log
        self._repeat_every = repeat_every
        self._failing: dict[str, tuple[int, float]] = {}  # what → (failures, last logged)

    def failed(self, what: str, exc: BaseException) -> None:
        """Record a failure of ``what``; log it if it is new or last logged long ago."""
        count, logged = self._failing.get(what, (0, 0.0))
        now = time.monotonic()
        if count == 0:
            if unreachable(exc):
                self._log.warning("%s failed: %r: %s", what, exc, UNREACHABLE_HINT)
            else:
                self._log.warning("%s failed: %r", what, exc, exc_info=exc)
            logged = now
        elif now - logged >= self._repeat_every:
            self._log.warning("%s still failing (%d times): %r", what, count + 1, exc)
            logged = now
        self._failing[what] = (count + 1, logged)

    def ok(self, what: str) -> None:
        """Record a success of ``what``; say so once if it had been failing."""
        count, _ = self._failing.pop(what, (0, 0.0))
        if count:
            self._log.warning("%s works again (after %d failures)", what, count)

    def failures(self, what: str) -> int:
        """Failures of ``what`` in a row so far (0 when it last worked)."""
        return self._failing.get(what, (0, 0.0))[0]
