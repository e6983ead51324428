"""Enqueue on the application's own connection, in its own transaction (§3.6).

The caller's driver writes the job, so it is visible iff the caller commits.
async `insert_job`: asyncpg ``Connection`` / pool proxy, psycopg 3
``AsyncConnection``, SQLAlchemy ``AsyncConnection`` / ``AsyncSession``. sync
`insert_job_sync`: psycopg 3 ``Connection``, SQLAlchemy ``Connection`` /
``Session``, Django ``connection`` / ``connections[alias]``.

Optional libraries are never imported: a connection of theirs exists only if the
application imported them, so their types are looked up in ``sys.modules``.
Validation is the producer's (before any write). The named statement runs with
its ``$n`` placeholders rewritten for the driver; JSON travels as text.

``after=`` / ``on_parent_failure`` and ``backpressure=`` behave as on the
client: the same statements, in the same order, run from the same plans
(`awa.enqueue.plan`) on the caller's driver, so the child and its edges are
in the caller's transaction and parents it inserted itself can be named.

Inside a transaction a *unique* job, and a job with ``after``, is inserted
under a savepoint, so a `UniqueConflict` or a refused parent leaves the
caller's transaction usable; outside one, a job with ``after`` takes a
transaction of its own. `QueueFull` is raised before anything is written and
leaves the transaction usable. Any other failure aborts the caller's
transaction, as Postgres dictates.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NoReturn, TypeVar, Unpack

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from awa.core.backpressure import QueueDepth
from awa.core.errors import (
    AwaError,
    DatabaseError,
    SchemaNotMigrated,
    UniqueConflict,
)
from awa.core.model import PUBLIC_FIELDS, Job
from awa.core.options import EnqueueOptions
from awa.db.errors import UNIQUE_CONSTRAINT, translate
from awa.db.queries import queries
from awa.enqueue.pipeline import Enqueue, prepare_one
from awa.enqueue.plan import Plan
from awa.telemetry import otel as telemetry

__all__ = ["insert_job", "insert_job_sync"]  # the callback functions: awa.worker.callbacks

_ASYNC_TYPES = ("an asyncpg Connection (or pool connection), a psycopg AsyncConnection, "
                "or a SQLAlchemy AsyncConnection / AsyncSession")
_SYNC_TYPES = ("a psycopg Connection, a SQLAlchemy Connection / Session, "
               "or a Django connection")
_OPTION_NAMES = EnqueueOptions.__optional_keys__ | EnqueueOptions.__required_keys__
_JSON_COLUMNS = ("args", "metadata", "errors", "progress", "output")
_PLACEHOLDER = re.compile(r"\$(\d+)")
_COMMENT_LINE = re.compile(r"^[ \t]*--.*\n?", re.MULTILINE)
_SCHEMA_STATES = {"42P01", "3F000", "42704", "42883"}  # undefined table/schema/object/function
Style = Literal["dollar", "format"]


def to_paramstyle(sql: str, params: Sequence[Any], style: Style) -> tuple[str, tuple[Any, ...]]:
    """Rewrite Awa's ``$n`` placeholders for a driver; ``format`` repeats reused params."""
    if style == "dollar":
        return sql, tuple(params)
    sql = _COMMENT_LINE.sub("", sql)  # a "$1" in a comment is no placeholder
    ordered: list[Any] = []

    def placeholder(match: re.Match[str]) -> str:
        ordered.append(params[int(match.group(1)) - 1])
        return "%s"

    return _PLACEHOLDER.sub(placeholder, sql.replace("%", "%%")), tuple(ordered)


def _module(name: str) -> Any:
    """An optional library if the application imported it, else None."""
    return sys.modules.get(name)


# -- driver adapters: the only driver-specific code ------------------------------

T = TypeVar("T")
Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Driver(Generic[T]):
    """How to run a statement on one connection: ``run(sql, params)`` → first row."""

    run: Callable[[str, Sequence[Any]], T]
    in_transaction: bool  # will a statement run inside a transaction block?
    json_decoded: bool  # does the driver already turn jsonb into Python values?


def _columns(description: Any, row: Any) -> Row | None:
    return None if row is None else {col[0]: v for col, v in zip(description, row, strict=True)}


def _asyncpg(conn: Any) -> _Driver[Awaitable[Row | None]]:
    async def run(sql: str, params: Sequence[Any]) -> Row | None:
        row = await conn.fetchrow(sql, *params)
        return None if row is None else dict(row.items())

    return _Driver(run, bool(conn.is_in_transaction()), json_decoded=False)


def _psycopg_async(conn: Any) -> _Driver[Awaitable[Row | None]]:
    async def run(sql: str, params: Sequence[Any]) -> Row | None:
        async with conn.cursor() as cur:
            await cur.execute(*to_paramstyle(sql, params, "format"))
            return _columns(cur.description, await cur.fetchone() if cur.description else None)

    return _Driver(run, _psycopg_in_transaction(conn), json_decoded=True)


def _cursor_sync(conn: Any, in_transaction: bool, json_decoded: bool) -> _Driver[Row | None]:
    """psycopg ``Connection`` and Django connections: DB-API cursors, ``%s`` params."""
    def run(sql: str, params: Sequence[Any]) -> Row | None:
        with conn.cursor() as cur:
            cur.execute(*to_paramstyle(sql, params, "format"))
            return _columns(cur.description, cur.fetchone() if cur.description else None)

    return _Driver(run, in_transaction, json_decoded)


def _psycopg_in_transaction(conn: Any) -> bool:
    # A non-autocommit connection begins implicitly; an autocommit one may be in a block.
    return not conn.autocommit or conn.info.transaction_status != 0  # 0: IDLE


async def _sqlalchemy_async(conn: Any) -> _Driver[Awaitable[Row | None]]:
    style = _sqlalchemy_style(conn.dialect)

    async def run(sql: str, params: Sequence[Any]) -> Row | None:
        result = await conn.exec_driver_sql(*to_paramstyle(sql, params, style))
        return _mapping(result)

    raw = await conn.get_raw_connection()
    return _Driver(run, not getattr(raw.dbapi_connection, "autocommit", False), True)


def _sqlalchemy_sync(conn: Any) -> _Driver[Row | None]:
    style = _sqlalchemy_style(conn.dialect)

    def run(sql: str, params: Sequence[Any]) -> Row | None:
        return _mapping(conn.exec_driver_sql(*to_paramstyle(sql, params, style)))

    raw = conn.connection.dbapi_connection
    return _Driver(run, not getattr(raw, "autocommit", False), True)


def _mapping(result: Any) -> Row | None:
    row = result.mappings().first() if result.returns_rows else None
    return None if row is None else dict(row)


def _sqlalchemy_style(dialect: Any) -> Style:
    if dialect.name != "postgresql":
        raise TypeError(f"awa.bridge needs a PostgreSQL engine, not {dialect.name!r}")
    if dialect.paramstyle == "numeric_dollar":
        return "dollar"
    if dialect.paramstyle in ("format", "pyformat"):
        return "format"
    raise TypeError(f"awa.bridge: unsupported SQLAlchemy paramstyle {dialect.paramstyle!r}")


def _family(conn: Any) -> str | None:
    """Which driver family ``conn`` belongs to, without side effects."""
    if isinstance(conn, asyncpg.Connection | PoolConnectionProxy):
        return "asyncpg"
    checks = (("psycopg", "AsyncConnection", "psycopg_async"),
              ("psycopg", "Connection", "psycopg"),
              ("sqlalchemy.ext.asyncio", "AsyncSession", "sa_async_session"),
              ("sqlalchemy.ext.asyncio", "AsyncConnection", "sa_async"),
              ("sqlalchemy.orm", "Session", "sa_session"),
              ("sqlalchemy.engine", "Connection", "sa"),
              ("django.utils.connection", "ConnectionProxy", "django_proxy"),
              ("django.db.backends.base.base", "BaseDatabaseWrapper", "django"))
    for module, name, family in checks:
        cls = getattr(_module(module), name, None)
        if isinstance(cls, type) and isinstance(conn, cls):
            return family
    return None


def _wrong_type(func: str, accepted: str, conn: Any, family: str | None) -> TypeError:
    cls = type(conn)
    name = f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins.")
    hint = ""
    if family is not None:
        hint = (" (use insert_job_sync for sync connections)" if func == "insert_job"
                else " (use insert_job for async connections)")
    return TypeError(f"Unsupported connection type {name}: {func}() needs {accepted}{hint}")


async def _async_driver(conn: Any) -> _Driver[Awaitable[Row | None]]:
    """The driver of an async connection, or TypeError naming the accepted types."""
    family = _family(conn)
    if family == "asyncpg":
        return _asyncpg(conn)
    if family == "psycopg_async":
        return _psycopg_async(conn)
    if family == "sa_async_session":
        return await _sqlalchemy_async(await conn.connection())
    if family == "sa_async":
        return await _sqlalchemy_async(conn)
    raise _wrong_type("insert_job", _ASYNC_TYPES, conn, family)


def _sync_driver(conn: Any) -> _Driver[Row | None]:
    """The driver of a sync connection, or TypeError naming the accepted types."""
    family = _family(conn)
    if family == "psycopg":
        return _cursor_sync(conn, _psycopg_in_transaction(conn), json_decoded=True)
    if family == "sa_session":
        return _sqlalchemy_sync(conn.connection())
    if family == "sa":
        return _sqlalchemy_sync(conn)
    if family == "django_proxy":  # django.db.connection: this thread's default connection
        conn, family = _module("django.db").connections[conn.alias], "django"
    if family == "django":
        if conn.vendor != "postgresql":
            raise TypeError(f"awa.bridge needs a PostgreSQL database, not {conn.vendor!r}")
        # Django loads jsonb as text (JSONField decodes it).
        return _cursor_sync(conn, not conn.get_autocommit(), json_decoded=False)
    raise _wrong_type("insert_job_sync", _SYNC_TYPES, conn, family)


# -- errors and rows -----------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    """The error, what it wraps (SQLAlchemy ``.orig``, Django ``__cause__``), and so on."""
    seen: list[BaseException] = []
    todo: list[Any] = [exc]
    while todo and len(seen) < 8:
        err = todo.pop(0)
        if isinstance(err, BaseException) and err not in seen:
            seen.append(err)
            todo += [getattr(err, "orig", None), err.__cause__]
    return seen


def _is_driver_error(exc: BaseException) -> bool:
    bases = [getattr(_module(m), n, None) for m, n in (
        ("psycopg", "Error"), ("psycopg2", "Error"), ("sqlalchemy.exc", "DBAPIError"),
        ("django.db", "Error"))]
    kinds = tuple(b for b in bases if isinstance(b, type))
    return isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, *kinds))


def _translate(exc: Exception) -> AwaError | None:
    """The Awa error for a failure of any supported driver, else None."""
    for err in _chain(exc):
        if isinstance(err, AwaError):
            return err
        if isinstance(err, asyncpg.PostgresError | asyncpg.InterfaceError):
            return translate(err)
        diag = getattr(err, "diag", None)  # psycopg 3 and psycopg2
        sqlstate = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if diag is not None and sqlstate:
            if sqlstate == "23505" and diag.constraint_name == UNIQUE_CONSTRAINT:
                detail = diag.message_detail or ""
                holder = int(detail) if detail.isdigit() else None
                suffix = f" (held by job {holder})" if holder is not None else ""
                return UniqueConflict(f"a job with the same unique key already exists{suffix}",
                                      conflicting_job_id=holder)
            if sqlstate in _SCHEMA_STATES:
                return SchemaNotMigrated(f"the Awa schema is missing or out of date ({err}); "
                                         "run `awa migrate` or `client.migrate()`")
    if any(_is_driver_error(err) for err in _chain(exc)):
        return DatabaseError(f"{type(exc).__name__}: {exc}")
    return None


def _decoded(row: dict[str, Any], json_decoded: bool) -> dict[str, Any]:
    """Normalize a row from any driver: JSON text → values, memoryview → bytes."""
    for name in _JSON_COLUMNS:
        value = row.get(name)
        # args/metadata are always objects; other columns may hold a JSON string.
        if isinstance(value, str) and (name in ("args", "metadata") or not json_decoded):
            row[name] = json.loads(value)
    for name, value in row.items():
        if isinstance(value, memoryview):
            row[name] = value.tobytes()
    return row


def _job_dict(row: dict[str, Any] | None) -> dict[str, Any]:
    """A `Job`'s fields as a dict with Python values (``state`` as its lowercase name)."""
    if row is None:
        raise DatabaseError("the insert returned no row")
    return job_dict(Job.from_row(row))


def job_dict(job: Job) -> dict[str, Any]:
    """A job as the bridge answers it (`insert_job`, the ``*_external_in`` functions)."""
    # The row's own names and values: times as datetimes (``run_at``, not ``run_at_datetime``).
    out = {name.removesuffix("_datetime"): getattr(job, name) for name in PUBLIC_FIELDS}
    out["state"] = str(job.state)
    out["traceparent"] = job.traceparent
    return out


# -- the shared plan runners -------------------------------------------------------

#: (before, after success, after failure) statements around a plan.
_Guard = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
_UNGUARDED: _Guard = ((), (), ())
_SAVEPOINT: _Guard = (("SAVEPOINT awa_bridge",), ("RELEASE SAVEPOINT awa_bridge",),
                      ("ROLLBACK TO SAVEPOINT awa_bridge", "RELEASE SAVEPOINT awa_bridge"))
_TRANSACTION: _Guard = (("BEGIN",), ("COMMIT",), ("ROLLBACK",))


def _guard(in_transaction: bool, savepoint: bool, atomic: bool) -> _Guard:
    """A savepoint inside the caller's transaction (so a failure leaves it usable,
    and a multi-statement plan is all or nothing); outside one, a transaction of
    its own for a plan that must be atomic."""
    if in_transaction:
        return _SAVEPOINT if savepoint or atomic else _UNGUARDED
    return _TRANSACTION if atomic else _UNGUARDED


def _reraise(exc: Exception) -> NoReturn:
    err = _translate(exc)
    if err is None or err is exc:
        raise exc
    raise err from exc


async def _run(conn: Any, plan: Plan[T], *, schema: str, savepoint: bool,
               atomic: bool = False) -> T:
    """Run a plan (`awa.enqueue.plan`) on the caller's async connection, each row
    normalized (`_decoded`); ``savepoint`` / ``atomic``: see `_guard`."""
    q = queries(schema)
    db = await _async_driver(conn)
    before, ok, undo = _guard(db.in_transaction, savepoint, atomic)
    try:
        for sql in before:
            await db.run(sql, ())
        try:
            name, params = next(plan)
            while True:
                row = await db.run(q[name], params)
                name, params = plan.send(None if row is None else _decoded(row, db.json_decoded))
        except StopIteration as done:
            result: T = done.value
        except Exception:
            for sql in undo:
                await db.run(sql, ())
            raise
        for sql in ok:
            await db.run(sql, ())
    except Exception as exc:
        _reraise(exc)
    return result


def _run_sync(conn: Any, plan: Plan[T], *, schema: str, savepoint: bool,
              atomic: bool = False) -> T:
    """The sync twin of `_run`."""
    q = queries(schema)
    db = _sync_driver(conn)
    before, ok, undo = _guard(db.in_transaction, savepoint, atomic)
    try:
        for sql in before:
            db.run(sql, ())
        try:
            name, params = next(plan)
            while True:
                row = db.run(q[name], params)
                name, params = plan.send(None if row is None else _decoded(row, db.json_decoded))
        except StopIteration as done:
            result: T = done.value
        except Exception:
            for sql in undo:
                db.run(sql, ())
            raise
        for sql in ok:
            db.run(sql, ())
    except Exception as exc:
        _reraise(exc)
    return result


def _check_options(func: str, opts: dict[str, Any]) -> None:
    unknown = sorted(set(opts) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"{func}() got unexpected keyword argument(s) {unknown}")


def _prepared(func: str, args: Any, opts: EnqueueOptions) -> Enqueue:
    """The pipeline's first stage (everything an insert checks before it touches
    the connection), after refusing options it does not know."""
    _check_options(func, dict(opts))
    return prepare_one(args, opts)


def _guarded(e: Enqueue) -> dict[str, bool]:
    """A unique job under a savepoint; a waiting job atomic (`_guard`)."""
    return {"savepoint": e.jobs[0].unique_key is not None, "atomic": e.parents is not None}


def _inserted(e: Enqueue, result: tuple[Any, dict[str, QueueDepth]]) -> dict[str, Any]:
    job = e.jobs[0]
    telemetry.inserted(job.kind, job.queue)
    out = _job_dict(dict(result[0]))
    if job.queue in result[1]:
        out["queue_depth"] = result[1][job.queue]
    return out


async def insert_job(conn: Any, args: Any, *, schema: str = "awa",
                     **opts: Unpack[EnqueueOptions]) -> dict[str, Any]:
    """Insert a job on the caller's async connection, in its current transaction.

    ``after`` / ``on_parent_failure`` and ``backpressure`` as on `AsyncClient.insert`
    (with backpressure the dict has the measured ``queue_depth``)."""
    e = _prepared("insert_job", args, opts)
    return _inserted(e, await _run(conn, e.plan(), schema=schema, **_guarded(e)))


def insert_job_sync(conn: Any, args: Any, *, schema: str = "awa",
                    **opts: Unpack[EnqueueOptions]) -> dict[str, Any]:
    """Insert a job on the caller's sync connection, in its current transaction
    (options as `insert_job`)."""
    e = _prepared("insert_job_sync", args, opts)
    return _inserted(e, _run_sync(conn, e.plan(), schema=schema, **_guarded(e)))


# -- the caller's connection as named statements (callback resolution) ------------
# `awa.worker.callbacks` resolves callbacks on it, by the one path the client
# takes too (`awa.db.statements`); ``awa.bridge`` holds the public functions.


class CallerStatements:
    """The caller's async connection running Awa's named statements: rows
    normalized (`_decoded`), driver errors raised as Awa's."""

    def __init__(self, db: _Driver[Awaitable[Row | None]], schema: str) -> None:
        self._db = db
        self._q = queries(schema)

    @classmethod
    async def of(cls, conn: Any, schema: str) -> CallerStatements:
        """Its statements on ``conn``, or TypeError naming the accepted types."""
        return cls(await _async_driver(conn), schema)

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    async def row(self, name: str, params: Sequence[Any]) -> Row | None:
        try:
            row = await self._db.run(self._q[name], params)
        except Exception as exc:
            _reraise(exc)
        return None if row is None else _decoded(row, self._db.json_decoded)

    async def execute(self, sql: str) -> None:
        try:
            await self._db.run(sql, ())
        except Exception as exc:
            _reraise(exc)


class CallerStatementsSync:
    """The sync twin of `CallerStatements` (plain methods)."""

    def __init__(self, conn: Any, schema: str) -> None:
        self._db = _sync_driver(conn)
        self._q = queries(schema)

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def row(self, name: str, params: Sequence[Any]) -> Row | None:
        try:
            row = self._db.run(self._q[name], params)
        except Exception as exc:
            _reraise(exc)
        return None if row is None else _decoded(row, self._db.json_decoded)

    def execute(self, sql: str) -> None:
        try:
            self._db.run(sql, ())
        except Exception as exc:
            _reraise(exc)

