"""The LISTEN connection and pooler detection never wait for ever on the network.

Behind a transaction-pooling PgBouncer that Awa detects by itself, `start()`
used to hang now and then: the LISTEN probe left a server connection
listening and then sent it a NOTIFY, and PgBouncer 1.18 then released
that server from whichever client it was just serving, whose statement was
never answered. A worker behind a detected pooler now never LISTENs, so
nothing it sends can do that. A small TCP proxy in front of the server shows
it: it records what the worker sends, and stalls a connection on demand (it
keeps the bytes and never answers, as a stuck pooler or a half-open socket
does), which every step of the LISTEN connection must survive within a bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from tests.helpers import FAST
from tests.pgbouncer import PgBouncer

import awa
from awa.db import listener as db_listener
from awa.db import pool as db_pool
from awa.db.queries import queries


@dataclass
class Work:
    n: int


class Proxy:
    """A TCP proxy to ``host:port`` that records what clients send and can stall."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.sent = bytearray()  #: every byte clients sent, in arrival order
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, database_url: str, **query: str) -> str:
        """``database_url`` through this proxy (same user, password and database)."""
        parts = urlsplit(database_url)
        user = parts.username or "postgres"
        if parts.password:  # the embedded server's users have one
            user += f":{parts.password}"
        netloc = f"{user}@127.0.0.1:{self.port}"
        extra = "&".join(f"{k}={v}" for k, v in query.items())
        return urlunsplit(parts._replace(netloc=netloc, query=extra))

    def stall(self) -> None:
        """From now on keep every byte, in both directions, and deliver none."""
        self._flowing.clear()

    async def close(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        for task in (self._pipe(reader, up_writer, record=True), self._pipe(up_reader, writer)):
            self._tasks.add(asyncio.create_task(task))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    record: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                if record:
                    self.sent += data
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            if self._flowing.is_set():
                writer.close()


@pytest.fixture
async def proxy(server_url: str) -> AsyncIterator[Proxy]:
    """A proxy in front of the test server."""
    parts = urlsplit(server_url)
    p = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


@pytest.mark.pgbouncer
async def test_a_worker_behind_a_detected_pooler_never_listens(
        server_url: str, database_url: str) -> None:
    """Nothing a worker or a waiter sends through a detected transaction pooler is a
    LISTEN (so no server connection is left listening for a NOTIFY to hit); start()
    returns, and jobs run and are waited for by polling."""
    bouncer = PgBouncer(server_url)
    spy = Proxy("127.0.0.1", bouncer.port)
    await spy.start()
    try:
        async with awa.AsyncClient(spy.url(database_url)) as client:
            @client.task(Work, queue="r")
            async def work(job: awa.JobContext) -> None:
                pass

            job = await client.insert(Work(4), queue="r")
            waiting = asyncio.create_task(job.wait(timeout=30, poll_interval=0.1))
            await asyncio.wait_for(client.start([("r", 2)], **FAST), 30)
            done = await waiting
            assert done.state is awa.JobState.Completed
            assert not (await client.health_check()).listen_enabled
            await client.shutdown()
        listened = b'LISTEN "' in spy.sent  # what asyncpg's add_listener sends
        assert spy.sent and not listened
    finally:
        await spy.close()
        bouncer.stop()


async def test_a_stalled_listen_connection_closes_within_its_bound(
        proxy: Proxy, client: awa.AsyncClient, database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A LISTEN connection whose peer stops answering (the close's goodbye is never
    acknowledged) is dropped after `LISTEN_STEP_TIMEOUT`, not waited on."""
    monkeypatch.setattr(db_listener, "LISTEN_STEP_TIMEOUT", 1.0)
    listener = db_listener.Listener(proxy.url(database_url, pgbouncer="false"),
                                    queries(), 0.05, lambda *_: None, lambda: None)
    stopping = asyncio.Event()
    task = asyncio.create_task(listener.run(stopping))
    deadline = time.monotonic() + 30
    while not listener.listening:
        assert time.monotonic() < deadline, "the listener never connected"
        await asyncio.sleep(0.05)
    proxy.stall()
    stopping.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    started = time.monotonic()
    await asyncio.wait_for(listener.close(), 15)  # generous: the bound is 1 s
    assert time.monotonic() - started < 10 and not listener.listening


async def test_pooler_detection_gives_up_on_a_stalled_server(
        proxy: Proxy, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Detection through a peer that accepts and never answers fails (the caller
    retries) instead of hanging; nothing is cached for the URL."""
    monkeypatch.setattr(db_pool, "DETECT_TIMEOUT", 0.5)
    proxy.stall()
    url = proxy.url(database_url)
    with pytest.raises((TimeoutError, asyncpg.InterfaceError, OSError)):
        await asyncio.wait_for(db_pool.behind_pooler(url), 15)
    assert db_pool.dsn.parse(url).dsn not in db_pool._detected


async def test_closing_a_pool_drops_a_connection_that_never_comes_back(
        database_url: str) -> None:
    """A connection stranded on a statement would hold a graceful close forever."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    stranded = await pool.acquire()  # never released, as if its statement never returned
    pid = stranded.get_server_pid()
    started = time.monotonic()
    await db_pool.close_pool_within(pool, 0.5)
    assert time.monotonic() - started < 5
    watcher = await asyncpg.connect(database_url)
    try:
        for _ in range(100):  # the server sees the dropped socket at once, give it 5 s
            if not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the stranded connection is still open")
    finally:
        await watcher.close()
