"""Test fixtures: a real PostgreSQL, one fresh database per test.

The server is ``$DATABASE_URL`` when set, else the embedded PostgreSQL. A
template database is migrated once per schema version; each test gets its
own copy (``CREATE DATABASE ... TEMPLATE``), so tests are isolated, cheap and
could run in parallel.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from tests.browser import page  # noqa: F401  (the browser tests' fixture)

import awa
from awa.db import migrations
from awa.db.pool import init_connection
from awa.db.queries import queries
from awa.telemetry.signals import Signals, listening

_counter = itertools.count()


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@pytest.fixture(scope="session")
def server_url() -> str:
    """A URL of the server's maintenance database."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        from awa.db.embedded import embedded_database_url

        url = embedded_database_url()
    return url


#: A database migrated from nothing enqueues plain jobs into the append-only
#: lane (migration 0020's awa.ring.enqueue, on for new databases);
#: AWA_TEST_RING=0 switches it off in the test databases, to run the suite
#: against awa.jobs alone, as a database upgraded from before the ring does.
RING = os.environ.get("AWA_TEST_RING") != "0"


def _template_name() -> str:
    digest = hashlib.sha1("".join(sql for _, _, sql in migrations.migrations()).encode())
    return f"awa_test_tpl_{digest.hexdigest()[:12]}{'' if RING else '_mutable'}"


@pytest.fixture(scope="session")
async def template_db(server_url: str) -> str:
    """A migrated template database, rebuilt whenever the migrations change."""
    name = _template_name()
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute("SELECT pg_advisory_lock(4242)")
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
            await awa.migrate(_with_database(server_url, name))
            if not RING:
                migrated = await asyncpg.connect(_with_database(server_url, name))
                try:
                    await migrated.execute(queries()["ring_enqueue_set"], False)
                finally:
                    await migrated.close()
            await conn.execute(f"ALTER DATABASE \"{name}\" WITH IS_TEMPLATE true")
        await conn.execute("SELECT pg_advisory_unlock(4242)")
    finally:
        await conn.close()
    return name


async def _fresh_database(server_url: str, name: str, template: str | None) -> str:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        suffix = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{suffix}')
    finally:
        await conn.close()
    return _with_database(server_url, name)


async def _drop_database(server_url: str, name: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _drop_now(server_url: str, name: str) -> None:
    try:
        asyncio.run(_drop_database(server_url, name))
    except Exception as exc:  # a database left behind is not a test failure
        print(f"could not drop test database {name}: {exc!r}")


@pytest.fixture(scope="session")
def _dropper(server_url: str) -> Iterator[Callable[[str], object]]:
    """Drops the tests' databases on a thread of its own, one after another.

    A DROP DATABASE waits for a checkpoint (PostgreSQL 15), about half a second
    on a busy machine: over a whole suite that was several minutes of tests
    waiting for nothing they need. The session ends once every drop is done.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="awa-test-dropper") as pool:
        yield lambda name: pool.submit(_drop_now, server_url, name)


@pytest.fixture
async def database_url(server_url: str, template_db: str,
                       _dropper: Callable[[str], object]) -> AsyncIterator[str]:
    """A fresh, migrated database for one test."""
    name = f"awa_test_{os.getpid()}_{next(_counter)}"
    yield await _fresh_database(server_url, name, template_db)
    _dropper(name)


@pytest.fixture
async def empty_database_url(server_url: str,
                             _dropper: Callable[[str], object]) -> AsyncIterator[str]:
    """A fresh database with no Awa schema, for migration tests."""
    name = f"awa_test_{os.getpid()}_{next(_counter)}_empty"
    yield await _fresh_database(server_url, name, None)
    _dropper(name)


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[awa.AsyncClient]:
    """An `AsyncClient` on the test's own database."""
    async with awa.AsyncClient(database_url) as c:
        yield c


@pytest.fixture
def sync_client(database_url: str) -> Iterator[awa.Client]:
    """A sync `Client` on the test's own database."""
    with awa.Client(database_url) as c:
        yield c


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A raw asyncpg connection to the test's database (JSON decoded), for assertions."""
    c = await asyncpg.connect(database_url)
    await init_connection(c)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def signals() -> Iterator[Signals]:
    """What the claim loops, the completer and the services announce during the test:
    wait on these instead of sleeping (`awa.telemetry.signals`)."""
    with listening() as heard:
        yield heard


@pytest.fixture
def awa_database_url(database_url: str) -> str:
    """Point the `awa.testing` plugin's ``awa_client`` fixture at the test's database."""
    return database_url


#: The optional suites: the marker their tests carry, and how to run them.
OPTIONAL_SUITES = (
    ("chaos", "AWA_CHAOS=1"),
    ("browser", "apt-get install chromium (or set AWA_CHROMIUM)"),
    ("pgbouncer", "apt-get install pgbouncer"),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that drives a browser (it uses the ``page`` fixture)."""
    for item in items:
        if "page" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)


def _optional_skips(terminalreporter: pytest.TerminalReporter) -> str | None:
    """One line naming the optional suites this run skipped and how to enable each."""
    counts = dict.fromkeys((name for name, _ in OPTIONAL_SUITES), 0)
    for report in terminalreporter.stats.get("skipped", []):
        for name, _ in OPTIONAL_SUITES:
            if name in report.keywords:
                counts[name] += 1
    parts = [f"{name} ({counts[name]} tests: {how})" for name, how in OPTIONAL_SUITES
             if counts[name]]
    return "optional suites skipped: " + "; ".join(parts) if parts else None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which optional suites were skipped; list the browser tests' screenshots."""
    skipped = _optional_skips(terminalreporter)
    if skipped:
        terminalreporter.write_line(skipped)
    shots = Path(__file__).resolve().parent.parent / "build" / "ui-screenshots"
    fresh = sorted(p for p in shots.glob("*.png") if p.stat().st_mtime >= _STARTED)
    if fresh:
        terminalreporter.write_line("web UI screenshots: " + ", ".join(str(p) for p in fresh))


_STARTED = time.time()
