"""Listener: the worker's one LISTEN connection, for wake-ups without polling.

Beside the pipeline: a NOTIFY on ``awa_jobs`` (a job became available in a
queue), ``awa_cancel`` (an attempt was cancelled or rescued) or
``awa_callback`` (a callback resolved) is handed to the runtime at once;
without the connection the runtime polls. The connection is probed every
`LISTEN_PROBE_INTERVAL`, because a half-open one delivers nothing and raises
nothing, and reopened with backoff after a failure. Every network step has a
bound (`LISTEN_STEP_TIMEOUT`), so a stalled connection is dropped, never
waited on. Behind a pooler, declared (``pgbouncer=true``) or detected, the
worker never LISTENs and only polls: see `run`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import asyncpg

from awa.core import states
from awa.db import dsn
from awa.db.pool import behind_pooler, close_within, connect
from awa.db.queries import Queries
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.runtime")
CHANNELS = ("awa_jobs", "awa_cancel", "awa_callback")
#: The longest any one step of the LISTEN connection may take (connect,
#: LISTEN, close); a step that takes longer drops the connection.
LISTEN_STEP_TIMEOUT = 10.0


class Listener:
    """Keeps a LISTEN connection open and hands each notification to ``on_notify``."""

    def __init__(self, url: str, q: Queries, poll_interval: float,
                 on_notify: Callable[[str, str], None],
                 on_connected: Callable[[], None],
                 channels: Sequence[str] = CHANNELS) -> None:
        self._url, self._q = url, q
        self._channels = tuple(channels)
        self._poll = poll_interval
        self._on_notify = on_notify
        self._on_connected = on_connected  #: catch up on what was sent while disconnected
        self._conn: asyncpg.Connection | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications arrive right now."""
        return self._conn is not None and not self._conn.is_closed()

    def _deliver(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        if isinstance(payload, str):
            self._on_notify(channel, payload)

    async def run(self, stopping: asyncio.Event) -> None:
        """Listen until ``stopping`` is set; reconnect after failures, poll meanwhile."""
        delay = 0.1
        poll_ms = round(self._poll * 1000)
        probe_every = states.LISTEN_PROBE_INTERVAL.total_seconds()
        probed_at = time.monotonic()
        failures = FailureLog(log)  # a lost database: one line, not one per reconnect
        # sql-safe: a log line's subject, never SQL
        what = f"LISTEN connection (polling every {poll_ms} ms meanwhile)"
        if dsn.parse(self._url).pooler:
            log.info("pgbouncer=true: LISTEN/NOTIFY is not used behind a transaction "
                     "pooler; polling every %d ms", poll_ms)
            return
        while not stopping.is_set():
            conn = self._conn
            try:
                if conn is None or conn.is_closed():
                    self._conn = None
                    if await behind_pooler(self._url):
                        # Detected, not declared. No probe: behind a transaction
                        # pooler, a LISTEN leaves a server connection listening,
                        # and PgBouncer 1.18 takes a server that receives a
                        # NOTIFY away from the client whose statement it is
                        # running, which then waits for ever (see pool.py).
                        log.warning("LISTEN/NOTIFY is not used behind a connection pooler "
                                    "(detected); polling every %d ms (a session pooler: "
                                    "see pgbouncer=false in the operations guide)", poll_ms)
                        return
                    conn = await connect(self._url, timeout=LISTEN_STEP_TIMEOUT)
                    async with asyncio.timeout(LISTEN_STEP_TIMEOUT):
                        for channel in self._channels:
                            await conn.add_listener(channel, self._deliver)
                    self._conn = conn
                    self._on_connected()
                    failures.ok(what)
                    delay = 0.1
                    probed_at = time.monotonic()
                await asyncio.sleep(self._poll)
                if time.monotonic() - probed_at >= probe_every:
                    # A half-open connection delivers nothing and raises nothing: probe it.
                    await conn.fetchval(self._q["connection_ping"], timeout=probe_every)
                    probed_at = time.monotonic()
            except asyncio.CancelledError:
                if conn is not None and conn is not self._conn:
                    conn.terminate()
                raise
            except Exception as exc:
                failures.failed(what, exc)
                if conn is not None and not conn.is_closed():
                    conn.terminate()  # a half-open one would never close by itself
                self._conn = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        """Close the connection (after `run` has ended), within `LISTEN_STEP_TIMEOUT`."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_within(conn, LISTEN_STEP_TIMEOUT)
