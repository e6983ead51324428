"""Listener: the worker's one LISTEN connection, for wake-ups without polling.

Beside the pipeline: a NOTIFY on ``awa_jobs`` (a job became available in a
queue), ``awa_cancel`` (an attempt was cancelled or rescued) or
``awa_callback`` (a callback resolved) is handed to the runtime at once;
without the connection the runtime polls. The connection is probed every
`LISTEN_PROBE_INTERVAL`, because a half-open one delivers nothing and raises
nothing, and reopened with backoff after a failure. Behind a transaction
pooler LISTEN cannot work: the URL says so (``pgbouncer=true``), or a NOTIFY
sent through the pool never arrives, and the worker only polls.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import asyncpg

from awa.core import states
from awa.core.waiting import wait_event
from awa.db import dsn
from awa.db.pool import behind_pooler, connect
from awa.db.queries import Queries
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.runtime")
CHANNELS = ("awa_jobs", "awa_cancel", "awa_callback")
#: How long a LISTEN connection behind a pooler waits for its probe NOTIFY.
LISTEN_PROBE_TIMEOUT = 3.0


class Listener:
    """Keeps a LISTEN connection open and hands each notification to ``on_notify``."""

    def __init__(self, url: str, pool: asyncpg.Pool, q: Queries, poll_interval: float,
                 on_notify: Callable[[str, str], None],
                 on_connected: Callable[[], None],
                 channels: Sequence[str] = CHANNELS) -> None:
        self._url, self._pool, self._q = url, pool, q
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
                    conn = await connect(self._url)
                    if await behind_pooler(self._url) and not await self._notify_reaches(conn):
                        await conn.close()
                        log.warning("LISTEN/NOTIFY does not work through this connection "
                                    "pooler (transaction pooling?); polling every %d ms",
                                    poll_ms)
                        return
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
        """Close the connection (after `run` has ended)."""
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()

    async def _notify_reaches(self, conn: asyncpg.Connection) -> bool:
        """Send a NOTIFY through the pool; True if ``conn`` receives it."""
        channel = f"awa_probe_{uuid.uuid4().hex}"
        arrived = asyncio.Event()

        def received(*_: object) -> None:
            arrived.set()
        await conn.add_listener(channel, received)
        await self._pool.execute(self._q["connection_notify_probe"], channel)
        if not await wait_event(arrived, LISTEN_PROBE_TIMEOUT):
            return False
        await conn.remove_listener(channel, received)
        return True
