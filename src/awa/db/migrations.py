"""Forward-only numbered migrations, applied under an advisory lock.

Files ``sql/migrations/NNNN_description.sql`` are never edited once released.
`apply` runs every pending one in a single transaction holding a
transaction-scoped advisory lock, so ten processes migrating at once apply
each migration exactly once; a database that is ahead of this code is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources

from awa.core.errors import SchemaNotMigrated
from awa.db.pool import Conn
from awa.db.queries import bind_schema, queries, validate_schema

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
#: First key of the two-int advisory lock; the second is hashtext(schema).
_LOCK_CLASS = 0x0A3A


@cache
def migrations() -> list[tuple[int, str, str]]:
    """Every shipped migration as ``(version, description, sql)``, in order."""
    found = []
    for entry in resources.files("awa.db").joinpath("sql", "migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append((int(m[1]), m[2].replace("_", " "), entry.read_text()))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps, got {versions}")
    return found


def migrations_range(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """The migrations with ``from_version < version <= to_version``, in order."""
    return [m for m in migrations() if from_version < m[0] <= to_version]


def schema_patches() -> list[tuple[str, str, str]]:
    """Versionless, idempotent patches ``(name, description, sql)``: Awa ships none."""
    return []


def current_migration_version() -> int:
    """The schema version this code expects (the newest shipped migration)."""
    return migrations()[-1][0]


async def database_version(conn: Conn, schema: str = "awa") -> int | None:
    """The version recorded in the database, or None if Awa was never installed."""
    table = f"{validate_schema(schema)}.schema_migrations"
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
    if not exists:
        return None
    sql = bind_schema("SELECT coalesce(max(version), 0) FROM awa.schema_migrations", schema)
    return int(await conn.fetchval(sql))


async def check(conn: Conn, schema: str = "awa") -> int:
    """Raise `SchemaNotMigrated` unless the database is exactly at our version."""
    have, want = await database_version(conn, schema), current_migration_version()
    if have is None or have < want:
        raise SchemaNotMigrated(
            f"schema {schema!r} is at version {have or 0}, this code needs {want}: "
            "run `awa migrate` or `client.migrate()`")
    if have > want:
        raise SchemaNotMigrated(
            f"schema {schema!r} is at version {have}, newer than this code's {want}: "
            "upgrade awa before running against this database")
    return have


def pending_sql(from_version: int, schema: str = "awa") -> list[tuple[int, str, str]]:
    """The migrations after ``from_version``, with the schema name bound."""
    return [(v, d, bind_schema(sql, schema)) for v, d, sql in migrations() if v > from_version]


async def apply(conn: Conn, schema: str = "awa", *,
                progress: Callable[[int, int], None] | None = None) -> list[int]:
    """Apply pending migrations; returns the versions applied (maybe none).

    ``progress(done, total)`` is called once the lock is held (done 0) and after
    each migration file, for a progress bar; the commit still comes at the end.
    """
    schema = validate_schema(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, schema)
        # sql-safe: schema passed validate_schema() above ([a-z_][a-z0-9_]*) and is quoted
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(bind_schema(
            "CREATE TABLE IF NOT EXISTS awa.schema_migrations ("
            " version integer PRIMARY KEY, description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())", schema))
        have = await database_version(conn, schema) or 0
        if have > current_migration_version():
            await check(conn, schema)
        applied: list[int] = []
        pending = pending_sql(have, schema)
        if progress is not None:
            progress(0, len(pending))
        for version, description, sql in pending:
            await conn.execute(sql)
            await conn.execute(
                bind_schema("INSERT INTO awa.schema_migrations (version, description)"
                            " VALUES ($1, $2)", schema), version, description)
            applied.append(version)
            if progress is not None:
                progress(len(applied), len(pending))
        if have == 0 and applied:
            # A database Awa installs from nothing enqueues plain jobs into the
            # append-only lane, which keeps up under a held xmin horizon (issue
            # 42): no worker of an older release can be serving it. An upgraded
            # one keeps where it enqueued (docs/storage.md, "Switching it on").
            await conn.execute(queries(schema)["ring_enqueue_set"], True)
        return applied
