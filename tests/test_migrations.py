"""Migrations: idempotent, concurrent-safe, version checks, shipped schema."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from tests.helpers import schema_at

import awa
from awa.db import migrations


def test_migrations_listed_in_order() -> None:
    found = awa.migrations()
    assert [v for v, _, _ in found] == list(range(1, len(found) + 1))
    assert all(isinstance(d, str) and sql.strip() for _, d, sql in found)
    assert awa.current_migration_version() == found[-1][0]


async def test_migrate_is_idempotent(empty_database_url: str) -> None:
    first = await awa.migrate(empty_database_url)
    assert first == list(range(1, awa.current_migration_version() + 1))
    assert await awa.migrate(empty_database_url) == []
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await migrations.database_version(conn) == awa.current_migration_version()
        rows = await conn.fetchval("SELECT count(*) FROM awa.schema_migrations")
        assert rows == awa.current_migration_version()
    finally:
        await conn.close()


async def test_a_new_database_enqueues_into_the_ring_and_keeps_a_switch_off(
        empty_database_url: str) -> None:
    """migrate() on a database with no Awa schema switches the append-only lane on
    (issue 42); a later migrate() leaves the switch where an operator put it."""
    await awa.migrate(empty_database_url)
    async with awa.AsyncClient(empty_database_url) as client:
        pool = await client.pool()
        assert await pool.fetchval("SELECT enqueue FROM awa.ring") is True
        job = await client.insert({"a": 1}, kind="k")
        assert await pool.fetchval("SELECT count(*) FROM awa.ready WHERE id = $1", job.id) == 1
        await client.set_ring_enqueue(False)
        assert await awa.migrate(empty_database_url) == []
        assert await pool.fetchval("SELECT enqueue FROM awa.ring") is False
    # An upgraded database keeps enqueueing into awa.jobs: tests/test_ring_upgrade.py.


async def test_ten_concurrent_migrations_apply_once(empty_database_url: str) -> None:
    results = await asyncio.gather(*(awa.migrate(empty_database_url) for _ in range(10)))
    applied = [r for r in results if r]
    assert len(applied) == 1  # exactly one process did the work
    conn = await asyncpg.connect(empty_database_url)
    try:
        count = await conn.fetchval("SELECT count(*) FROM awa.schema_migrations")
        assert count == awa.current_migration_version()
    finally:
        await conn.close()


async def test_newer_schema_is_refused(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("INSERT INTO awa.schema_migrations (version, description) "
                           "VALUES (9999, 'from the future')")
    finally:
        await conn.close()
    with pytest.raises(awa.SchemaNotMigrated, match="newer than this code"):
        await awa.migrate(database_url)
    async with awa.AsyncClient(database_url) as client:
        with pytest.raises(awa.SchemaNotMigrated, match="newer"):
            await client.check_schema()


async def test_unmigrated_database_gives_schema_error(empty_database_url: str) -> None:
    async with awa.AsyncClient(empty_database_url) as client:
        with pytest.raises(awa.SchemaNotMigrated):
            await client.check_schema()
        with pytest.raises(awa.SchemaNotMigrated):
            await client.insert({"a": 1}, kind="k")


async def test_custom_schema(empty_database_url: str) -> None:
    async with awa.AsyncClient(empty_database_url, schema="jobs_here") as client:
        await client.migrate()
        job = await client.insert({"a": 1}, kind="k")
        assert (await client.get_job(job.id)).kind == "k"
    conn = await asyncpg.connect(empty_database_url)
    try:
        tables = await conn.fetch("SELECT table_schema FROM information_schema.tables "
                                  "WHERE table_name = 'jobs'")
        assert {r["table_schema"] for r in tables} == {"jobs_here"}
    finally:
        await conn.close()
    with pytest.raises(awa.ValidationError, match="schema"):
        awa.AsyncClient(empty_database_url, schema="bad; drop table x")


async def test_python_states_match_database_enum(conn: asyncpg.Connection) -> None:
    labels = await conn.fetchval("SELECT enum_range(NULL::awa.job_state)::text[]")
    assert labels == [s.value for s in awa.JobState]


async def test_done_table_mirrors_active_table(conn: asyncpg.Connection) -> None:
    query = ("SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass "
             "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
    active = [r[0] for r in await conn.fetch(query, "awa.jobs")]
    done = [r[0] for r in await conn.fetch(query, "awa.jobs_done")]
    dlq = [r[0] for r in await conn.fetch(query, "awa.dlq")]
    # Columns added after 0001 are appended to each table (PostgreSQL cannot
    # insert one in the middle): jobs_done is jobs with prune_after after the
    # 0001 columns, the DLQ jobs_done with its own three after those.
    first = active.index("callback_timeout_at") + 1
    assert done == [*active[:first], "prune_after", *active[first:]]
    assert dlq == [*done[:first + 1], "reason", "dlq_at", "original_run_lease",
                   *done[first + 1:]]


async def test_migrate_sql_for_schema_is_bound() -> None:
    pending = migrations.pending_sql(0, "other")
    # 'awa.defer_notify' is a setting's name, not a schema reference: it stays.
    assert all("awa." not in sql.replace("'awa_", "").replace("awa.defer_notify", "")
               for _, _, sql in pending)


async def test_column_domains_upgrade_keeps_jobs_and_grants(empty_database_url: str) -> None:
    """0017 rewrites awa.jobs into domain-typed columns: rows, the view and its
    grants survive, and the checks still refuse bad rows from any writer."""
    role = f"awa_reader_{abs(hash(empty_database_url)) % 10**8}"
    conn = await asyncpg.connect(empty_database_url)
    try:
        await schema_at(conn, 16)
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.execute(f'CREATE ROLE "{role}"')
        await conn.execute(f'GRANT SELECT ON awa.jobs_all TO "{role}"')
        old = await conn.fetchval(
            "INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, tags) "
            "VALUES ('k', 'q', '{\"a\": 1}', 'available', 2, 5, '{t}') RETURNING id")
        assert await awa.migrate(empty_database_url) == list(
            range(17, awa.current_migration_version() + 1))
        row = await conn.fetchrow("SELECT kind, args, tags FROM awa.jobs_all WHERE id = $1", old)
        assert (row["kind"], row["tags"]) == ("k", ["t"])
        assert await conn.fetchval(
            "SELECT has_table_privilege($1, 'awa.jobs_all', 'SELECT')", role)
        good = {"kind": "k", "priority": 2, "args": "{}", "run_at": "2030-01-01", "tags": []}
        for column, bad in (("kind", ""), ("priority", 9), ("args", "[1]"),
                            ("run_at", "infinity"), ("tags", ["x"] * 21)):
            values = {**good, column: bad}
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(
                    "INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, "
                    "run_at, tags) VALUES ($1, 'q', $2::text::jsonb, 'available', $3, 5, "
                    "$4::text::timestamptz, $5)", values["kind"], values["args"],
                    values["priority"], values["run_at"], values["tags"])
        async with awa.AsyncClient(empty_database_url) as client:
            assert (await client.get_job(old)).args == {"a": 1}
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.close()


async def test_the_ring_turns_upgrade_keeps_its_slot_switch_and_grants(
        empty_database_url: str) -> None:
    """0024 replaces awa.ring's row by a record of turns: the slot being written,
    the enqueue switch and the rights granted on awa.ring carry over, and a role
    granted them can still enqueue into and read the ring without a new `awa grants`."""
    role = f"awa_ring_{abs(hash(empty_database_url)) % 10**8}"
    conn = await asyncpg.connect(empty_database_url)
    try:
        await schema_at(conn, 23)
        await conn.execute("UPDATE awa.ring SET slot = 2, enqueue = true")
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.execute(f'CREATE ROLE "{role}"')
        await conn.execute(f'GRANT USAGE ON SCHEMA awa TO "{role}"')
        await conn.execute(f'GRANT SELECT, UPDATE ON awa.ring TO "{role}"')
        assert await awa.migrate(empty_database_url) == list(
            range(24, awa.current_migration_version() + 1))
        assert await conn.fetchval("SELECT awa.ring_slot()") == 2
        assert await conn.fetchval("SELECT enqueue FROM awa.ring_config") is True
        for table, right in (("awa.ring_turns", "SELECT"), ("awa.ring", "SELECT"),
                             ("awa.ring", "UPDATE")):
            assert await conn.fetchval("SELECT has_table_privilege($1, $2, $3)",
                                       role, table, right), (table, right)
        async with conn.transaction():
            await conn.execute(f'SET LOCAL ROLE "{role}"')
            assert await conn.fetchval("SELECT slot FROM awa.ring") == 2
            assert await conn.fetchval("SELECT awa.ring_slot()") == 2
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.close()


async def test_the_lean_attempts_upgrade_keeps_open_ring_attempts_completable(
        empty_database_url: str) -> None:
    """0025 swaps the receipts' two indexes for one and closes attempts through
    awa.ring_close: an attempt claimed before the upgrade is found by id and
    completes once after it; a second completion of it writes nothing."""
    from datetime import timedelta

    from awa.db.queries import queries
    conn = await asyncpg.connect(empty_database_url)
    try:
        await schema_at(conn, 24)
        await conn.execute("UPDATE awa.ring_config SET enqueue = true")
        await conn.execute("INSERT INTO awa.ring_lanes VALUES ('q', 2)")
        await conn.execute("INSERT INTO awa.ready (queue, priority, kind, args, max_attempts) "
                           "SELECT 'q', 2, 'k', '{}'::jsonb, 5 FROM generate_series(1, 2)")
        claimed = await conn.fetch("SELECT * FROM awa.claim('q', 2, 0, 0)")
        assert len(claimed) == 2
        assert await awa.migrate(empty_database_url) == list(
            range(25, awa.current_migration_version() + 1))
        indexes = {r["indexname"] for r in await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'awa' "
            "AND tablename = 'receipts'")}
        assert indexes == {"receipts_attempt"}
        first = claimed[0]
        assert await conn.fetchval("SELECT count(*) FROM awa.receipts WHERE id = $1",
                                   first["id"]) == 1
        complete = queries()["attempt_complete_batch"]
        args = ([r["id"] for r in claimed], [r["run_lease"] for r in claimed], None,
                timedelta(days=1), [r["receipt_slot"] for r in claimed])
        assert {r["id"] for r in await conn.fetch(complete, *args)} == \
            {r["id"] for r in claimed}
        assert await conn.fetch(complete, *args) == []
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done") == 2
        assert await conn.fetchval("SELECT count(*) FROM awa.closures") == 2
    finally:
        await conn.close()


async def test_the_presence_upgrade_keeps_the_leader_workers_and_grants(
        empty_database_url: str) -> None:
    """0028 makes leadership and presence append-only records: a worker of the
    previous release that leads keeps its lease and shows as present, and a role
    granted rights on the old tables (and on the ring's reclaim) gets them on the
    new ones without a new `awa grants`."""
    role = f"awa_presence_{abs(hash(empty_database_url)) % 10**8}"
    conn = await asyncpg.connect(empty_database_url)
    try:
        await schema_at(conn, 27)
        await conn.execute("INSERT INTO awa.leader (holder, expires_at) "
                           "VALUES ('old:1', now() + interval '1 minute')")
        await conn.execute("INSERT INTO awa.runtime_instances (instance_id, hostname, pid, "
                           "version, started_at, last_seen_at) "
                           "VALUES ('old:1', 'h', 1, '0', now(), now())")
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.execute(f'CREATE ROLE "{role}"')
        await conn.execute(f'GRANT USAGE ON SCHEMA awa TO "{role}"')
        await conn.execute(f'GRANT SELECT, INSERT, UPDATE ON awa.leader, awa.runtime_instances '
                           f'TO "{role}"')
        await conn.execute(f'GRANT EXECUTE ON FUNCTION awa.ring_reclaim(text, smallint) '
                           f'TO "{role}"')
        assert await awa.migrate(empty_database_url) == list(
            range(28, awa.current_migration_version() + 1))
        assert await conn.fetchval("SELECT holder FROM awa.leadership") == "old:1"
        assert await conn.fetchval("SELECT array_agg(instance_id) FROM awa.presence") == ["old:1"]
        for table, right in (("awa.leader_terms", "INSERT"), ("awa.presence_beats", "INSERT"),
                             ("awa.leadership", "SELECT"), ("awa.presence", "SELECT")):
            assert await conn.fetchval("SELECT has_table_privilege($1, $2, $3)",
                                       role, table, right), (table, right)
        assert await conn.fetchval("SELECT has_function_privilege($1, $2, 'EXECUTE')", role,
                                   "awa.rotation_tidy(text)")
        assert not await conn.fetchval("SELECT has_function_privilege('public', $1, 'EXECUTE')",
                                       "awa.rotation_tidy(text)")
        async with conn.transaction():
            await conn.execute(f'SET LOCAL ROLE "{role}"')
            # The old worker leads: a worker of this release does not take the lease.
            assert await conn.fetchval("SELECT awa.leader_take('new:2', interval '5 s')") \
                is False
            assert await conn.fetchval("SELECT awa.rotation_tidy('presence_beats')") is False
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.close()
