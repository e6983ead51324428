"""awa.bridge: enqueue on the application's own connection and transaction.

Every driver family runs the same scenarios through a small harness (`Tx`):
commit and rollback together with an application row; unique conflicts (the
transaction stays usable), validation before any write, translated errors. Sync
drivers run on one dedicated thread each, as an application would (Django's
connections are per thread and refuse to run inside an event loop).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from tests.helpers import TO_MUTABLE, wait_until
from tests.test_telemetry import Otel, otel  # noqa: F401  (the fixture)

import awa
from awa.core import states
from awa.core.model import PUBLIC_FIELDS, Outcome
from awa.db.queries import queries
from awa.enqueue.bridge import insert_job, insert_job_sync, to_paramstyle
from awa.worker.completion import Completer


@dataclass
class Email:
    to: str


@dataclass
class Tx:
    """One open application transaction on some driver."""

    insert: Callable[..., Awaitable[dict[str, Any]]]
    app_row: Callable[[str], Awaitable[Any]]
    end: Callable[[bool], Awaitable[Any]]  # True: commit, False: roll back


class Worker:
    """A single thread for a sync connection (keeps Django's thread-local state)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1)

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, partial(fn, *args, **kw))


def _sa_url(url: str, driver: str) -> str:
    return url.replace("postgresql://", f"postgresql+{driver}://", 1)


_APP_SQL = text("INSERT INTO app_rows VALUES (:v)")


@asynccontextmanager
async def asyncpg_tx(url: str) -> AsyncIterator[Tx]:
    conn = await asyncpg.connect(url)
    tr = conn.transaction()
    await tr.start()
    try:
        yield Tx(partial(insert_job, conn),
                 lambda v: conn.execute("INSERT INTO app_rows VALUES ($1)", v),
                 lambda commit: tr.commit() if commit else tr.rollback())
    finally:
        await conn.close()


@asynccontextmanager
async def asyncpg_pool_tx(url: str) -> AsyncIterator[Tx]:
    async with asyncpg.create_pool(url, min_size=1, max_size=1) as pool, \
            pool.acquire() as conn:
        await conn.execute("BEGIN")  # a manually started transaction
        yield Tx(partial(insert_job, conn),
                 lambda v: conn.execute("INSERT INTO app_rows VALUES ($1)", v),
                 lambda commit: conn.execute("COMMIT" if commit else "ROLLBACK"))


@asynccontextmanager
async def psycopg_async_tx(url: str) -> AsyncIterator[Tx]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        yield Tx(partial(insert_job, conn),
                 lambda v: conn.execute("INSERT INTO app_rows VALUES (%s)", (v,)),
                 lambda commit: conn.commit() if commit else conn.rollback())


@asynccontextmanager
async def sa_asyncpg_conn_tx(url: str) -> AsyncIterator[Tx]:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(_sa_url(url, "asyncpg"), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.begin()
            yield Tx(partial(insert_job, conn),
                     lambda v: conn.execute(_APP_SQL, {"v": v}),
                     lambda commit: conn.commit() if commit else conn.rollback())
    finally:
        await engine.dispose()


@asynccontextmanager
async def sa_psycopg_async_session_tx(url: str) -> AsyncIterator[Tx]:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(_sa_url(url, "psycopg"), poolclass=NullPool)
    try:
        async with AsyncSession(engine) as session:  # autobegin
            yield Tx(partial(insert_job, session),
                     lambda v: session.execute(_APP_SQL, {"v": v}),
                     lambda commit: session.commit() if commit else session.rollback())
    finally:
        await engine.dispose()


def _sync_tx(work: Worker, conn: Any, app_row: Callable[[str], Any],
             commit: Callable[[], Any], rollback: Callable[[], Any]) -> Tx:
    return Tx(lambda args, **opts: work(insert_job_sync, conn, args, **opts),
              lambda v: work(app_row, v),
              lambda c: work(commit if c else rollback))


@asynccontextmanager
async def psycopg_tx(url: str) -> AsyncIterator[Tx]:
    work = Worker()
    conn = await work(psycopg.connect, url)
    try:
        yield _sync_tx(work, conn, lambda v: conn.execute("INSERT INTO app_rows VALUES (%s)", (v,)),
                       conn.commit, conn.rollback)
    finally:
        await work(conn.close)
        work.pool.shutdown()


@asynccontextmanager
async def sa_conn_tx(url: str) -> AsyncIterator[Tx]:
    work = Worker()
    engine = create_engine(_sa_url(url, "psycopg"), poolclass=NullPool)
    conn = await work(engine.connect)
    try:
        await work(conn.begin)
        yield _sync_tx(work, conn, lambda v: conn.execute(_APP_SQL, {"v": v}),
                       conn.commit, conn.rollback)
    finally:
        await work(conn.close)
        await work(engine.dispose)
        work.pool.shutdown()


@asynccontextmanager
async def sa_session_tx(url: str) -> AsyncIterator[Tx]:
    work = Worker()
    engine = create_engine(_sa_url(url, "psycopg"), poolclass=NullPool)
    session = Session(engine)  # autobegin
    try:
        yield _sync_tx(work, session, lambda v: session.execute(_APP_SQL, {"v": v}),
                       session.commit, session.rollback)
    finally:
        await work(session.close)
        await work(engine.dispose)
        work.pool.shutdown()


def configure_django(url: str) -> None:
    """Point Django's ``default`` database at ``url`` (settings configured once)."""
    import django
    from django.conf import settings

    parts = urlsplit(url)
    db = {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
          "HOST": parts.hostname or "", "PORT": str(parts.port or 5432),
          "USER": parts.username or "", "PASSWORD": parts.password or ""}
    if not settings.configured:
        settings.configure(DATABASES={"default": db}, USE_TZ=True)
        django.setup()
    from django.db import connections

    connections["default"].close()
    connections.settings["default"].update(db)


@asynccontextmanager
async def django_tx(url: str) -> AsyncIterator[Tx]:
    from django.db import connection, transaction

    def app_row(v: str) -> None:
        with connection.cursor() as cur:
            cur.execute("INSERT INTO app_rows VALUES (%s)", [v])

    def finish(commit: bool) -> None:
        if not commit:
            transaction.set_rollback(True)
        atomic.__exit__(None, None, None)

    work = Worker()
    await work(configure_django, url)
    atomic = transaction.atomic()
    await work(atomic.__enter__)
    try:
        yield Tx(lambda args, **opts: work(insert_job_sync, connection, args, **opts),
                 lambda v: work(app_row, v), lambda c: work(finish, c))
    finally:
        await work(lambda: connection.close())
        work.pool.shutdown()


FAMILIES: dict[str, Callable[[str], AbstractAsyncContextManager[Tx]]] = {
    "asyncpg": asyncpg_tx,
    "asyncpg_pool": asyncpg_pool_tx,
    "psycopg_async": psycopg_async_tx,
    "psycopg": psycopg_tx,
    "sqlalchemy_asyncpg_connection": sa_asyncpg_conn_tx,
    "sqlalchemy_psycopg_async_session": sa_psycopg_async_session_tx,
    "sqlalchemy_connection": sa_conn_tx,
    "sqlalchemy_session": sa_session_tx,
    "django": django_tx,
}


# SQLAlchemy's asyncio extension needs greenlet (the ``sqlalchemy[asyncio]`` extra).
_NO_GREENLET = pytest.mark.skipif(importlib.util.find_spec("greenlet") is None,
                                  reason="greenlet (sqlalchemy[asyncio]) is not installed")


_SA_ASYNC = {"sqlalchemy_asyncpg_connection", "sqlalchemy_psycopg_async_session"}


@pytest.fixture(params=[pytest.param(name, marks=[_NO_GREENLET] if name in _SA_ASYNC else [])
                        for name in FAMILIES])
def family(request: pytest.FixtureRequest) -> Callable[[str], AbstractAsyncContextManager[Tx]]:
    return FAMILIES[request.param]


@pytest.fixture
async def app_db(database_url: str, conn: asyncpg.Connection) -> str:
    """The test database, with the application's own table."""
    await conn.execute("CREATE TABLE app_rows (v text)")
    return database_url


async def app_rows(conn: asyncpg.Connection) -> list[str]:
    return [r["v"] for r in await conn.fetch("SELECT v FROM app_rows ORDER BY v")]


def as_dict(job: awa.Job) -> dict[str, Any]:
    # Every field a user sees (not the worker's own `receipt_slot`).
    out = {name.removesuffix("_datetime"): getattr(job, name) for name in PUBLIC_FIELDS}
    return {**out, "state": str(job.state), "traceparent": job.traceparent}


async def test_commit_and_rollback(family: Any, app_db: str, client: awa.AsyncClient,
                                   conn: asyncpg.Connection) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with family(app_db) as tx:
        await tx.app_row("kept")
        job = await tx.insert(Email("a@example.com"), tags=["x", "y%"], metadata={"m": 1})
        scheduled = await tx.insert({"n": 1}, kind="report", run_at=later, priority=1)
        await tx.end(True)
    assert job["kind"] == "email" and job["state"] == "available"
    assert job["args"] == {"to": "a@example.com"} and job["tags"] == ["x", "y%"]
    assert job["metadata"] == {"m": 1} and isinstance(job["created_at"], datetime)
    assert scheduled["state"] == "scheduled" and scheduled["run_at"] == later
    assert job == as_dict(await client.get_job(job["id"]))
    assert scheduled == as_dict(await client.get_job(scheduled["id"]))

    async with family(app_db) as tx:
        await tx.app_row("rolled back")
        lost = await tx.insert(Email("b@example.com"))
        await tx.end(False)
    with pytest.raises(awa.JobNotFound):
        await client.get_job(lost["id"])
    assert await app_rows(conn) == ["kept"]


async def test_unique_conflict_validation_and_database_errors(
        family: Any, app_db: str, client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    async with family(app_db) as tx:
        first = await tx.insert(Email("u@example.com"), unique_opts={"by_args": True})
        with pytest.raises(awa.UniqueConflict) as info:
            await tx.insert(Email("u@example.com"), unique_opts={})
        assert info.value.conflicting_job_id == first["id"]
        with pytest.raises(awa.ValidationError, match="priority"):
            await tx.insert(Email("v@example.com"), priority=9)
        with pytest.raises(TypeError, match="bogus"):
            await tx.insert(Email("v@example.com"), bogus=1)
        await tx.app_row("still usable")  # the savepoint kept the transaction alive
        await tx.end(True)
    assert (await client.get_job(first["id"])).state is awa.JobState.Available
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1
    assert await app_rows(conn) == ["still usable"]

    async with family(app_db) as tx:  # database errors are translated too
        with pytest.raises(awa.SchemaNotMigrated):
            await tx.insert(Email("w@example.com"), schema="nowhere")
        with pytest.raises(awa.DatabaseError, match="aborted"):  # as Postgres dictates
            await tx.insert(Email("w@example.com"))
        await tx.end(False)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1


async def _finish(conn: asyncpg.Connection, job_id: int, state: str = "completed") -> None:
    """Finish an active job the way the runtime's statements do (a move to jobs_done)."""
    await conn.execute(TO_MUTABLE, job_id)  # a ring job moves to awa.jobs first
    await conn.execute(
        "WITH moved AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
        "INSERT INTO awa.jobs_done SELECT f.* FROM moved m, "
        "LATERAL awa.finished(m.j, $2::awa.job_state, interval '1 hour') f", job_id, state)


async def test_after_in_the_callers_transaction(family: Any, app_db: str,
                                                client: awa.AsyncClient,
                                                conn: asyncpg.Connection) -> None:
    done = await client.insert(Email("done@example.com"))
    await _finish(conn, done.id)
    async with family(app_db) as tx:
        parent = await tx.insert(Email("p@example.com"))  # this transaction's own, uncommitted
        child = await tx.insert(Email("c@example.com"), after=[parent],  # the dict will do
                                on_parent_failure="run_anyway")
        ready = await tx.insert(Email("r@example.com"), after=[done])
        with pytest.raises(awa.ValidationError, match=r"^after: no job has id"):
            await tx.insert(Email("x@example.com"), after=[parent["id"], 10_000_000])
        with pytest.raises(awa.ValidationError, match=r"^on_parent_failure"):
            await tx.insert(Email("x@example.com"), on_parent_failure="discard")
        with pytest.raises(awa.ValidationError, match=r"^run_at"):
            await tx.insert(Email("x@example.com"), after=[done], run_at=datetime.now(UTC))
        await tx.app_row("still usable")  # the refused inserts left nothing behind
        await tx.end(True)
    assert child["state"] == "scheduled" and child["run_at"].year == 9999
    assert ready["state"] == "available"  # its parent had completed: applied at once
    assert child == as_dict(await client.get_job(child["id"]))
    assert (await client.get_job(parent["id"])).metadata == {"_awa_dependents": True}
    edges = await conn.fetch("SELECT parent_id, child_id, policy FROM awa.job_dependencies "
                             "ORDER BY child_id")
    assert [tuple(e) for e in edges] == [(parent["id"], child["id"], "run_anyway"),
                                         (done.id, ready["id"], "cancel")]
    assert await app_rows(conn) == ["still usable"]
    await _finish(conn, parent["id"], "failed")
    assert (await client.get_job(child["id"])).state is awa.JobState.Available

    async with family(app_db) as tx:  # the child and its edges roll back with the caller
        lost = await tx.insert(Email("l@example.com"), after=[child["id"]])
        await tx.end(False)
    with pytest.raises(awa.JobNotFound):
        await client.get_job(lost["id"])
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 2


async def test_after_outside_a_transaction_is_atomic(database_url: str,
                                                     client: awa.AsyncClient,
                                                     conn: asyncpg.Connection) -> None:
    """On an autocommit connection a job with after takes a transaction of its own:
    a refused parent leaves neither the child nor a parent's mark behind."""
    parent = await client.insert(Email("p@example.com"))
    own = await asyncpg.connect(database_url)
    sync_conn = psycopg.connect(database_url, autocommit=True)
    try:
        with pytest.raises(awa.ValidationError, match="after"):
            await insert_job(own, Email("x@example.com"), after=[parent.id, 10_000_000])
        assert not own.is_in_transaction()
        with pytest.raises(awa.ValidationError, match="after"):
            insert_job_sync(sync_conn, Email("x@example.com"), after=[10_000_000])
        assert (await client.get_job(parent.id)).metadata == {}
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1
        child = await insert_job(own, Email("c@example.com"), after=[parent.id])
        other = insert_job_sync(sync_conn, Email("d@example.com"), after=[parent.id])
        assert not own.is_in_transaction()
    finally:
        await own.close()
        sync_conn.close()
    assert await conn.fetchval("SELECT array_agg(child_id ORDER BY child_id) "
                               "FROM awa.job_dependencies") == [child["id"], other["id"]]


async def test_after_parent_lock_on_the_callers_connection(database_url: str,
                                                           client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    """As with the client: a parent finishing while the caller's transaction holds a
    child of it waits for that commit, then releases the child."""
    parent = await client.insert(Email("p@example.com"))
    app = psycopg.connect(database_url)  # a transaction opens implicitly
    finisher = await asyncpg.connect(database_url)
    try:
        child = insert_job_sync(app, Email("c@example.com"), after=[parent.id])
        done = asyncio.create_task(_finish(finisher, parent.id))

        async def blocked() -> bool:
            return bool(await conn.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                finisher.get_server_pid()))

        await wait_until(blocked, message="the parent's finish to wait for the insert")
        app.commit()
        await done
    finally:
        app.close()
        await finisher.close()
    assert (await client.get_job(child["id"])).state is awa.JobState.Available


async def test_after_a_running_parent_on_the_callers_connection(database_url: str,
                                                                client: awa.AsyncClient,
                                                                conn: asyncpg.Connection) -> None:
    """The worker's completion of a running parent, while the caller's transaction
    holds a child of it, waits for that commit, then releases the child. With the
    ring on, the insert moved the open attempt to awa.jobs; the completion's closure
    loses to that move once it commits, and the job is finished there."""
    parent = await client.insert(Email("p@example.com"))
    pool = await client.pool()
    [claimed] = await pool.fetch(queries()["attempt_claim"], "default", 1, 0.0, 60.0)
    assert claimed["id"] == parent.id
    completer = Completer(pool, queries(), completed_retention=timedelta(days=1),
                          failed_retention=timedelta(days=1))
    app = psycopg.connect(database_url)  # a transaction opens implicitly
    try:
        child = insert_job_sync(app, Email("c@example.com"), after=[parent.id])
        done = asyncio.create_task(completer.write(
            parent.id, claimed["run_lease"], Outcome("completed"), slot=claimed["receipt_slot"]))

        async def blocked() -> bool:
            return bool(await conn.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"))

        await wait_until(blocked, message="the parent's completion to wait for the insert")
        assert not done.done()
        app.commit()
        assert await asyncio.wait_for(done, 30)
    finally:
        app.close()
    assert (await client.get_job(parent.id)).state is awa.JobState.Completed
    assert (await client.get_job(child["id"])).state is awa.JobState.Available


async def test_backpressure_in_the_callers_transaction(
        family: Any, app_db: str, client: awa.AsyncClient, conn: asyncpg.Connection,
        otel: Otel) -> None:  # noqa: F811  (the fixture)
    await client.enqueue_many_copy([Email(f"{n}@example.com") for n in range(5)],
                                   queue="mail")
    async with family(app_db) as tx:
        await tx.app_row("mine")
        with pytest.raises(awa.QueueFull) as full:
            await tx.insert(Email("x@example.com"), queue="mail",
                            backpressure=awa.Reject(5))
        assert (full.value.queue, full.value.depth, full.value.limit) == ("mail", 5, 5)
        job = await tx.insert(Email("y@example.com"), queue="mail", backpressure="signal")
        assert job["queue_depth"] == awa.QueueDepth("mail", 5, states.DEPTH_SIGNAL_CAP)
        # The count sees this transaction's own uncommitted job.
        with pytest.raises(awa.QueueFull):
            await tx.insert(Email("z@example.com"), queue="mail", backpressure=awa.Reject(6))
        await tx.insert(Email("w@example.com"), queue="mail", backpressure=awa.Reject(7))
        with pytest.raises(awa.ValidationError, match=r"^backpressure"):
            await tx.insert(Email("v@example.com"), backpressure="sometimes")
        await tx.end(True)  # QueueFull left the transaction usable
    assert await app_rows(conn) == ["mine"]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE queue = 'mail'") == 7
    assert otel.value("awa.enqueue.signalled", kind="email", queue="mail") == 1
    assert otel.value("awa.enqueue.rejected", kind="email", queue="mail") == 2


async def test_wrong_connection_types(database_url: str) -> None:
    with pytest.raises(TypeError, match="asyncpg Connection"):
        await insert_job(42, Email("x"))
    with pytest.raises(TypeError, match="psycopg Connection"):
        insert_job_sync(42, Email("x"))
    sync_conn = psycopg.connect(database_url)
    async_conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(TypeError, match="use insert_job_sync"):
            await insert_job(sync_conn, Email("x"))
        with pytest.raises(TypeError, match="use insert_job for async"):
            insert_job_sync(async_conn, Email("x"))
        with pytest.raises(awa.ValidationError, match="schema"):
            await insert_job(async_conn, Email("x"), schema="Not Valid")
    finally:
        sync_conn.close()
        await async_conn.close()


async def test_autocommit_connection(database_url: str, client: awa.AsyncClient) -> None:
    """Outside a transaction each insert commits on its own; no savepoint is needed."""
    conn = await asyncpg.connect(database_url)
    try:
        first = await insert_job(conn, Email("c@example.com"), unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await insert_job(conn, Email("c@example.com"), unique_opts={})
        assert not conn.is_in_transaction()
    finally:
        await conn.close()
    assert (await client.get_job(first["id"])).kind == "email"


def test_django_autocommit_alias(database_url: str) -> None:
    """A plain sync test: ``connections[alias]`` in Django's default autocommit mode."""
    from django.db import connections

    configure_django(database_url)
    conn = connections["default"]
    try:
        first = insert_job_sync(conn, Email("d@example.com"), unique_opts={})
        with pytest.raises(awa.UniqueConflict) as info:
            insert_job_sync(conn, Email("d@example.com"), unique_opts={})
        assert info.value.conflicting_job_id == first["id"]
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM awa.jobs_all")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_paramstyle_translation() -> None:
    sql = "SELECT $1, $2, '5%', $1"
    assert to_paramstyle(sql, ("a", "b"), "dollar") == (sql, ("a", "b"))
    assert to_paramstyle(sql, ("a", "b"), "format") == (
        "SELECT %s, %s, '5%%', %s", ("a", "b", "a"))
    # Whole-line comments go (their "$2" is no placeholder); the statement stays.
    assert to_paramstyle("-- rows of $2\n  -- and $1\nSELECT $1", ("a", "b"), "format") == (
        "SELECT %s", ("a",))
