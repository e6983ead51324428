"""Connections: the asyncpg pool with Awa's codecs, pooler detection, the default URL.

Behind a transaction-pooling PgBouncer (or any pooler that hands each
transaction to whichever server connection is free) nothing may rely on
session state: the driver must not cache prepared statements, settings are
made per transaction, and LISTEN does not work. Awa knows it is behind one
when the URL says ``pgbouncer=true`` (see `awa.db.dsn`), or when the backend
process id the server announces at connection start is not the one
``pg_backend_pid()`` reports: only a pooler in between makes them differ.

Awa never LISTENs through a pooler it detected (see `awa.db.listener`): a
LISTEN through a transaction pooler leaves a server connection listening,
and PgBouncer 1.18 (Debian 12's) releases a server from its client when that server
receives a NOTIFY while it is just starting the client's statement (it takes
the notification for the end of the transaction): the statement's answer is
dropped and the client waits for ever.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Literal

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from awa.core.serialize import nested_too_deeply
from awa.core.states import CLAIM_PLAN_LIFETIME
from awa.db import dsn
from awa.db.queries import queries
from awa.telemetry.failures import REPEAT_EVERY, UNREACHABLE_HINT, unreachable


class _QuietPoolFloor(logging.Filter):
    """asyncpg's pool logs "Failed to restore the pool connection floor" with a traceback
    every few hundred milliseconds while the database is down (hundreds of lines a
    minute): while it is unreachable, one line every `REPEAT_EVERY` seconds, without."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -REPEAT_EVERY

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not unreachable(exc):
            return True
        now = time.monotonic()
        if now - self._last < REPEAT_EVERY:
            return False
        self._last = now
        record.msg, record.args = "%s: %r: %s", (record.getMessage(), exc, UNREACHABLE_HINT)
        record.exc_info = record.exc_text = None
        return True


logging.getLogger("asyncpg.pool").addFilter(_QuietPoolFloor())
log = logging.getLogger("awa.db")

#: A connection as Awa code receives it: direct, or borrowed from a pool.
Conn = asyncpg.Connection | PoolConnectionProxy


def _json_text(value: Any) -> bytes:
    # Statements receive JSON already serialized (validated by the producer).
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text.encode()


def _encode_jsonb(value: Any) -> bytes:
    # Binary jsonb: a version byte, then the text. Called once per row of a
    # bulk COPY, so the usual case (text from the producer) is one expression.
    if type(value) is str:
        return ("\x01" + value).encode()
    return b"\x01" + _json_text(value)


_JSON = json.JSONDecoder()


class UndecodableJson(dict[str, Any]):
    """Stands for a stored JSON value too deeply nested for Python to decode
    (only another writer can store one: Awa refuses them). Empty, so it is
    falsy and encodes as ``{}``; the executor fails a job whose args are one."""


def _decode_jsonb(data: bytes) -> Any:
    # Every claimed row carries two JSON columns; on the hot path this is a
    # tenth of the worker's time with json.loads. The server's text is valid
    # JSON, so the decoder reads it in place (after the version byte) as str.
    if data == b"\x01{}":
        return {}
    if nested_too_deeply(data):  # the same rule on every Python, before any recursion
        return UndecodableJson()
    try:
        return _JSON.raw_decode(data.decode(), 1)[0]
    except RecursionError:  # one such row must not fail the whole result
        return UndecodableJson()


async def init_connection(conn: asyncpg.Connection) -> None:
    """Per-connection setup: binary JSON codecs (COPY needs binary) returning Python values."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_encode_jsonb,
                              decoder=_decode_jsonb, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=_json_text,
                              decoder=json.loads, format="binary")


def resolve_database_url(database_url: str | None) -> str:
    """An explicit URL, else ``$DATABASE_URL``, else the embedded server's."""
    if database_url:
        return dsn.check_url(database_url, "database_url")
    env = os.environ.get("DATABASE_URL")
    if env:
        return dsn.check_url(env, "$DATABASE_URL")
    from awa.db.embedded import embedded_database_url

    return embedded_database_url()


#: OIDs below this are PostgreSQL's own types, the same in every database.
FIRST_USER_OID = 16384
#: asyncpg's type introspection rows for `BUILTIN_ARRAY_OIDS`, by server
#: version, shared by the process's connections (see AwaConnection).
_builtin_types: dict[Any, dict[int, Any]] = {}
#: PostgreSQL's array types of the scalars Awa and its users pass (bool, bytea,
#: int2, int4, int8, float4, float8, numeric, varchar, date, timestamp,
#: timestamptz, interval, uuid, json, jsonb, xid8: fixed OIDs, pg_type.dat),
#: looked up with whatever a connection first asks for, so that one lookup
#: serves the process.
BUILTIN_ARRAY_OIDS = (1000, 1001, 1005, 1007, 1016, 1021, 1022, 1231, 1015, 1182,
                      1115, 1185, 1187, 2951, 199, 3807, 271)


class _NoStatement:
    """Stands for the introspection statement that did not run (asyncpg re-prepares
    the caller's unnamed statement only when one did)."""

    name = "awa-builtin-types"


class AwaConnection(asyncpg.Connection):
    """Pooled connection that skips asyncpg's reset round trip on release, and
    looks up each built-in type once per process rather than once per connection.

    Awa's statements leave no session state behind (no LISTEN, no session
    advisory locks, temp tables are ON COMMIT DROP), so the reset query would
    only cost a round trip per operation. Code using `Transaction` should use
    ``SET LOCAL`` rather than ``SET``.

    asyncpg knows only ``text[]`` and ``oid[]`` among array types; for any
    other (``bigint[]``, ``boolean[]``, ...) each new connection runs its
    introspection query, about 17 ms of server time, before its first
    statement that uses one. A worker opens a few connections as it starts
    and more as load grows, each first using a different few of them. So the
    first lookup of a built-in type takes the common array types with it
    (`BUILTIN_ARRAY_OIDS`), and rows for PostgreSQL's own types (fixed OIDs)
    are reused by every later connection; every other type (Awa's enums, whose
    OIDs differ by database; ranges, composites, domains) is looked up by
    asyncpg as before.
    """

    def get_reset_query(self) -> str:
        return ""

    async def _introspect_types(self, typeoids: Any, timeout: Any) -> Any:
        known = _builtin_types.setdefault(self.get_server_version(), {})
        oids = list(typeoids)
        if oids and all(oid in known for oid in oids):
            return [known[oid] for oid in oids], _NoStatement()
        if any(oid < FIRST_USER_OID for oid in oids):
            oids += [oid for oid in BUILTIN_ARRAY_OIDS if oid not in known and oid not in oids]
        result = await super()._introspect_types(oids, timeout)  # type: ignore[misc]
        try:
            # Only these: each row alone describes its type (its element has a
            # codec of asyncpg's own), unlike, say, int4range[] or an
            # information_schema domain's array, whose element needs a row too.
            for row in result[0]:
                if row["oid"] in BUILTIN_ARRAY_OIDS:
                    known[row["oid"]] = row
        except (TypeError, KeyError, IndexError):  # another asyncpg's shape: no sharing
            pass
        return result


_detected: dict[str, bool] = {}
#: Bounds each step of pooler detection (connect, one query, close): a stalled
#: pooler fails the caller (which retries) instead of hanging it.
DETECT_TIMEOUT = 10.0


async def close_within(conn: asyncpg.Connection, timeout: float) -> None:
    """Close ``conn`` gracefully within ``timeout`` seconds, else drop its socket: a
    graceful close waits for the server (or a pooler) to hang up, which a stalled one
    never does. Never raises but for cancellation (the connection is gone either way)."""
    if conn.is_closed():
        return
    try:
        await conn.close(timeout=timeout)
    except asyncio.CancelledError:
        conn.terminate()
        raise
    except Exception:
        conn.terminate()


#: How long closing a pool waits for its connections to come back before it drops them.
POOL_CLOSE_TIMEOUT = 10.0


async def close_pool_within(pool: asyncpg.Pool, timeout: float = POOL_CLOSE_TIMEOUT) -> None:
    """Close ``pool`` gracefully within ``timeout`` seconds, else terminate it: a graceful
    close waits for every borrowed connection, and one stranded on a statement the server
    (or a pooler) never answers would hold it forever."""
    try:
        await asyncio.wait_for(pool.close(), timeout)
    except TimeoutError:
        log.warning("pool close: connections still busy after %.0f s; dropping them", timeout)
        pool.terminate()


async def behind_pooler(database_url: str) -> bool:
    """True if connections to ``database_url`` go through a pooler (declared or
    detected once per URL and process)."""
    target = dsn.parse(database_url)
    if target.pooler is not None:
        return target.pooler
    if target.dsn not in _detected:
        conn = await asyncpg.connect(target.dsn, statement_cache_size=0,
                                     timeout=DETECT_TIMEOUT,
                                     server_settings={"application_name": "awa-probe"})
        try:
            backend = await conn.fetchval(queries()["connection_backend_pid"],
                                          timeout=DETECT_TIMEOUT)
        except BaseException:
            conn.terminate()
            raise
        await close_within(conn, DETECT_TIMEOUT)
        _detected[target.dsn] = backend != conn.get_server_pid()
    return _detected[target.dsn]


def _driver_options(pooled: bool) -> dict[str, Any]:
    """asyncpg options for a direct or a pooled connection: behind a pooler,
    statements are never prepared by name (the next one may reach another server)."""
    return {"statement_cache_size": 0} if pooled else {}


async def connect(database_url: str, timeout: float = 60.0) -> asyncpg.Connection:
    """One connection outside any pool (the LISTEN connection), pooler-aware;
    ``timeout`` bounds the connection start."""
    pooled = await behind_pooler(database_url)
    return await asyncpg.connect(dsn.parse(database_url).dsn, timeout=timeout,
                                 **_driver_options(pooled))


#: The claim pool reads awa.jobs only through indexes, in index order. A plan
#: knows only what the last ANALYZE saw: taken at a moment when almost no job
#: was available, it sorted a bitmap scan of every available job per claim
#: (a sequential scan, when the table was empty at start-up). As a backlog
#: grew, so did each claim (5-15 ms instead of about 1.5), which grew the
#: backlog further, until a later ANALYZE saw it: the soak's 2-4 s slow
#: windows every few minutes. These settings only price those plans out.
REUSED_PLAN_SHAPE = {"enable_seqscan": "off", "enable_bitmapscan": "off"}


async def create_pool(database_url: str, *, max_connections: int = 10,
                      application_name: str = "awa",
                      command_timeout: float | None = None,
                      idle_in_transaction_timeout: float | None = None,
                      plans: Literal["custom", "reused"] | None = None) -> AwaPool:
    """A pool whose connections all carry Awa's codecs, fit for a pooler when
    one is declared or detected.

    Connections carry no session settings beyond ``application_name`` (which
    PgBouncer forwards), and no statement turns ``synchronous_commit`` off:
    claims commit durably, since a run lease must never be handed out twice
    (a claim turns it on for its own transaction where it is off; see
    docs/architecture.md). On a direct
    connection, ``idle_in_transaction_timeout`` lets the server end a session
    whose client vanished mid-transaction (a half-open connection would
    otherwise hold its row locks for ever); behind a pooler, the pooler's own
    ``idle_transaction_timeout`` does that job. Neither ends a session its client
    left in the middle of a statement (after asyncpg's Parse, Describe and Flush,
    before its Bind, Execute and Sync), which no server timeout covers: the
    runtime's rescue pass ends those of its own pools (`Rescuer`, by
    ``application_name``).

    ``plans`` (the runtime's pools, direct connections only; JIT is off for
    both) chooses how statements are planned. PostgreSQL's default settles on
    a generic plan after five runs and keeps it: one made while awa.jobs was
    empty went on scanning the table once a backlog built up (1.3 s per claim
    at 300,000 jobs, measured). ``"custom"`` plans every run afresh.
    ``"reused"`` (the claim pool) plans once per `CLAIM_PLAN_LIFETIME`: each
    statement is dropped from the cache and prepared again after that long,
    so a plan never outlives the table size it was made for by more than a
    moment, while the claims in between skip planning (half their server time).
    JIT is off because a claim planned against a big backlog could cross
    ``jit_above_cost`` and compile for most of a second. Reused plans read
    awa.jobs by index only (`REUSED_PLAN_SHAPE`).
    """
    pooled = await behind_pooler(database_url)
    settings = {"application_name": application_name}
    options = _driver_options(pooled)
    if idle_in_transaction_timeout is not None and not pooled:
        settings["idle_in_transaction_session_timeout"] = \
            f"{round(idle_in_transaction_timeout * 1000)}ms"
    if plans is not None and not pooled:
        settings["jit"] = "off"
        if plans == "custom":
            settings["plan_cache_mode"] = "force_custom_plan"
        else:
            settings["plan_cache_mode"] = "force_generic_plan"
            settings.update(REUSED_PLAN_SHAPE)
            options["max_cached_statement_lifetime"] = \
                CLAIM_PLAN_LIFETIME.total_seconds()
    # asyncpg.create_pool, with its defaults, building our subclass.
    pool = AwaPool(
        dsn.parse(database_url).dsn, min_size=1, max_size=max_connections,
        max_queries=50_000, max_inactive_connection_lifetime=300.0, loop=None,
        record_class=asyncpg.Record, init=init_connection, server_settings=settings,
        connection_class=AwaConnection, command_timeout=command_timeout, **options)
    await pool
    return pool


class AwaPool(asyncpg.Pool):
    """asyncpg's pool, telling its owner (``on_demand``) when a connection is asked
    for while every one is in use: the owner may be keeping one idle that the
    asker would otherwise wait for (the client's producer connection)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_demand: Callable[[], None] | None = None

    def acquire(self, *, timeout: float | None = None) -> Any:
        # Every slot taken, a connection still opening included: this one would wait.
        # (asyncpg's queue of free slots; the public counts miss one being opened.)
        if self.on_demand is not None and self._queue.empty():  # type: ignore[attr-defined]
            self.on_demand()
        return super().acquire(timeout=timeout)


def _detached(exc: asyncpg.InterfaceError) -> bool:
    """True for asyncpg's error on a pool connection it has already taken back."""
    return "released back to the pool" in str(exc)


class HeldConnection:
    """One pool connection kept between the statements of a single sequential
    user (a claim loop, the completion flusher).

    Borrowing and returning a connection per statement (asyncpg's acquire,
    reset and shielded release) cost about a tenth of a busy worker's CPU.
    The connection goes back to the pool after any failed statement (the next
    one borrows afresh, so a broken connection is replaced) and on `release`.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: PoolConnectionProxy | None = None

    async def fetch(self, sql: str, *args: Any, timeout: float | None = None) -> list[Any]:
        result: list[Any] = await self._run("fetch", sql, args, timeout)
        return result

    async def execute(self, sql: str, *args: Any) -> str:
        result: str = await self._run("execute", sql, args)
        return result

    async def _run(self, method: str, sql: str, args: tuple[Any, ...],
                   timeout: float | None = None) -> Any:
        conn = self._conn if self._conn is not None else await self._borrow()
        kwargs = {} if timeout is None else {"timeout": timeout}
        try:
            return await getattr(conn, method)(sql, *args, **kwargs)
        except asyncpg.InterfaceError as exc:
            if not _detached(exc):
                await self.release()
                raise
        except BaseException:
            await self.release()
            raise
        # The server closed the held connection while it sat idle (a restart, a
        # killed backend): asyncpg already took it back, and nothing was sent.
        # Borrow a live one and run the statement there, once.
        self._conn = None
        conn = await self._borrow()
        try:
            return await getattr(conn, method)(sql, *args, **kwargs)
        except BaseException:
            await self.release()
            raise

    async def _borrow(self) -> PoolConnectionProxy:
        self._conn = await self._pool.acquire()
        return self._conn

    async def release(self) -> None:
        """Give the connection back to the pool (if one is held)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.release(conn)
