"""Database roles (docs/security.md): an owner migrates, a runtime role without DDL
rights runs everything, a reader gets a read-only web UI.

Roles are cluster-wide, so each test makes its own (unique names, with a
password for servers that check one) and drops them, with its database.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest
from click.testing import CliRunner
from tests.helpers import FAST, TO_MUTABLE, wait_for_state, wait_until
from tests.ui_helpers import call, serving

import awa
from awa.cli import main as cli
from awa.db.roles import grants_sql
from awa.web.ui import ui_app

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


@dataclass
class Roles:
    owner: str
    runtime: str
    reader: str
    names: tuple[str, str, str]


def _as(url: str, role: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}:{quote(password)}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def roles(server_url: str, empty_database_url: str) -> AsyncIterator[Roles]:
    """Owner, runtime and reader roles; the owner owns the (empty) test database."""
    tag = f"{os.getpid()}_{next(_counter)}"
    names = (f"awa_t_owner_{tag}", f"awa_t_runtime_{tag}", f"awa_t_reader_{tag}")
    password = secrets.token_hex(12)
    database = urlsplit(empty_database_url).path.lstrip("/")
    admin = await asyncpg.connect(server_url)
    try:
        for name in names:
            await admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        await admin.execute(f'ALTER DATABASE "{database}" OWNER TO {names[0]}')
        yield Roles(*(_as(empty_database_url, n, password) for n in names), names=names)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        for name in names:
            await admin.execute(f"DROP ROLE IF EXISTS {name}")
        await admin.close()


async def _migrate_and_grant(r: Roles) -> None:
    """What an operator does: migrate as the owner, then run the documented GRANTs."""
    await awa.migrate(r.owner)
    conn = await asyncpg.connect(r.owner)
    try:
        await conn.execute(grants_sql(r.names[1]))
        await conn.execute(grants_sql(r.names[2], read_only=True))
        # An old hourly partition for maintenance to drop (through SECURITY DEFINER).
        await conn.execute("CREATE TABLE awa.jobs_done_p2020010100 PARTITION OF awa.jobs_done "
                           "FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-01 01:00+00')")
    finally:
        await conn.close()


@dataclass
class Work:
    n: int


@dataclass
class Fails:
    n: int


@dataclass
class Waits:
    n: int


@dataclass
class Tick:
    pass


async def test_runtime_role_runs_workers_maintenance_cron_dlq_and_callbacks(
        roles: Roles) -> None:
    await _migrate_and_grant(roles)
    tokens: dict[int, str] = {}
    async with awa.AsyncClient(roles.runtime) as client:
        assert await client.check_schema() == awa.current_migration_version()

        @client.task(Work)
        async def work(job: awa.JobContext) -> object:
            if job.args.n == 1 and job.attempt == 1:
                return awa.RetryAfter(0.05)
            job.enqueue_on_completion(Tick())
            return None

        @client.task(Fails, queue="dlq")
        async def fails(job: awa.JobContext) -> None:
            raise awa.TerminalError("no")

        @client.task(Waits)
        async def waits(job: awa.JobContext) -> object:
            token = await job.register_callback(timeout_seconds=60)
            tokens[job.id] = token.id
            return awa.WaitForCallback(token)

        @client.task(Tick)
        async def tick(job: awa.JobContext) -> None:
            pass

        client.periodic("tick", "* * * * * *", Tick, Tick())
        ids = [(await client.insert(Work(n))).id for n in range(3)]
        await client.insert_many_copy([Work(n) for n in range(3, 6)])
        await client.enqueue_many_copy([Work(n) for n in range(6, 9)])
        failing = await client.insert(Fails(0), queue="dlq")
        parked = await client.insert(Waits(0))
        stale = await client.insert(Work(99))
        owner = await asyncpg.connect(roles.owner)
        try:  # a crashed worker's attempt, for the runtime role's rescue to take over
            await owner.execute(TO_MUTABLE, stale.id)
            await owner.execute("UPDATE awa.jobs SET state = 'running', attempt = 1, "
                                "run_lease = 1, heartbeat_at = now() - interval '1 hour' "
                                "WHERE id = $1", stale.id)
        finally:
            await owner.close()

        await client.start([("default", 4), ("dlq", 1)], **FAST, dlq_enabled_by_default=True)
        runtime = client.runtime
        assert runtime is not None
        try:
            await wait_for_state(client, parked.id, awa.JobState.WaitingExternal)
            done = await client.complete_external(tokens[parked.id], {"ok": True})
            assert done.state is awa.JobState.Completed

            async def settled() -> bool:
                jobs = [await client.get_job(i) for i in [*ids, stale.id, parked.id]]
                ticks = await client.list_jobs(kind="tick", state="completed")
                return all(j.state is awa.JobState.Completed for j in jobs) \
                    and await client.dlq_depth(queue="dlq") == 1 and len(ticks) >= 5
            await wait_until(settled, timeout=30, message="jobs, rescue, DLQ, cron and callbacks")
            assert (await client.get_job(stale.id)).attempt == 2  # rescued, then run again
            assert [j.attempt for j in [await client.get_job(ids[1])]] == [2]

            cleanup = runtime.service("cleanup")
            await cleanup.run_once()  # creates partitions ahead, drops the 2020 one
            assert cleanup.failures == 0
            # Terms, beats and the tidy of their spent partitions (SECURITY DEFINER).
            for name in ("leader", "presence"):
                await runtime.service(name).run_once()
                assert runtime.service(name).failures == 0, name
            assert runtime.leader.is_leader
            tidy = await (await client.pool()).fetchrow(
                "SELECT awa.rotation_tidy('presence_beats') AS p, "
                "awa.rotation_tidy('leader_terms') AS l")
            assert tidy is not None and tidy["p"] is False and tidy["l"] is False  # nothing spent
        finally:
            await client.shutdown()

        entry = (await client.list_dlq(queue="dlq"))[0]
        assert entry.job.id == failing.id and entry.reason == "terminal_error"
        assert (await client.retry_from_dlq(failing.id)).state is awa.JobState.Available
        await client.pause_queue("dlq")
        assert (await client.cancel(failing.id)).state is awa.JobState.Cancelled
        await client.resume_queue("dlq")
        assert any(s.queue == "default" for s in await client.queue_stats())
        assert await client.delete_cron_job("tick")

        pool = await client.pool()
        partitions = await pool.fetch(
            "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'awa.jobs_done'::regclass")
        names = {p["relname"] for p in partitions}
        assert "jobs_done_p2020010100" not in names
        # Hourly partitions made ahead (through SECURITY DEFINER), owned by the owner role.
        assert len(names) >= 2 and {p["owner"] for p in partitions} == {roles.names[0]}

        # No DDL for the runtime role.
        for ddl in ("CREATE TABLE awa.evil (x int)", "DROP TABLE awa.jobs",
                    "ALTER TABLE awa.jobs ADD COLUMN evil int", "TRUNCATE awa.jobs_done",
                    "CREATE SCHEMA evil", "CREATE FUNCTION awa.evil() RETURNS int "
                    "LANGUAGE sql AS 'SELECT 1'"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await pool.execute(ddl)
        with pytest.raises(awa.DatabaseError, match="permission denied"):
            await client.migrate()


async def test_reader_role_gets_a_read_only_ui_and_nothing_else(roles: Roles) -> None:
    await _migrate_and_grant(roles)
    async with awa.AsyncClient(roles.runtime) as client:
        job = await client.insert(Work(1))
    async with serving(ui_app(roles.reader)) as base:
        assert (await call(f"{base}/api/config"))[1]["read_only"] is True
        status, page = await call(f"{base}/api/jobs")
        assert status == 200 and [j["id"] for j in page["jobs"]] == [job.id]
        assert (await call(f"{base}/api/overview"))[0] == 200
        assert (await call(f"{base}/api/queues/default/pause", {}))[0] == 403
    conn = await asyncpg.connect(roles.reader)
    try:
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1
        for sql in ("UPDATE awa.jobs SET priority = 1", "DELETE FROM awa.jobs",
                    "INSERT INTO awa.queues (queue) VALUES ('x')",
                    "SELECT awa.drop_done_partitions(now() + interval '10 years')",
                    "SELECT awa.ensure_done_partitions(now() + interval '10 years')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        # No SECURITY DEFINER function of the schema is left executable by PUBLIC.
        assert await conn.fetch(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'awa'::regnamespace AND p.prosecdef "
            "AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a "
            "     WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))") == []
    finally:
        await conn.close()


def test_documented_grants_are_the_shipped_ones() -> None:
    doc = (ROOT / "docs" / "security.md").read_text()
    assert grants_sql("awa_runtime") in doc
    assert grants_sql("awa_reader", read_only=True) in doc
    assert "docs/security.md" in (ROOT / "README.md").read_text()
    result = CliRunner().invoke(cli, ["grants", "awa_runtime"])
    assert result.exit_code == 0 and result.output == grants_sql("awa_runtime")
    result = CliRunner().invoke(cli, ["--schema", "jobs", "grants", "ui", "--read-only"])
    assert result.exit_code == 0 and "GRANT SELECT ON ALL TABLES IN SCHEMA jobs TO ui;" \
        in result.output and "jobs.drop_done_partitions(timestamptz)" in result.output
    result = CliRunner().invoke(cli, ["grants", "x; DROP TABLE awa.jobs"])
    assert result.exit_code == 1 and "role" in result.output


async def _true(value: bool) -> bool:
    return value


WRITERS = ("ensure_done_partitions(timestamptz)",
           "ensure_done_partitions(timestamptz, timestamptz)",
           "drop_done_partitions(timestamptz)", "unique_claim_sync()",
           "unique_claim_release()", "notify_inserted()", "wake_waiters(bigint)")


async def test_migrate_alone_leaves_no_writing_function_to_public(roles: Roles) -> None:
    """Before any `awa grants`: a role with only USAGE and SELECT can neither call
    the partition functions nor write rows, and the finished history survives."""
    await awa.migrate(roles.owner)
    owner = await asyncpg.connect(roles.owner)
    try:
        await owner.execute(f"GRANT USAGE ON SCHEMA awa TO {roles.names[2]}; "
                            f"GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {roles.names[2]}")
        await owner.execute("CREATE TABLE awa.jobs_done_p2020010100 PARTITION OF awa.jobs_done "
                            "FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-01 01:00+00')")
        for writer in WRITERS:
            assert not await owner.fetchval(
                "SELECT has_function_privilege('public', $1, 'EXECUTE')", f"awa.{writer}")
    finally:
        await owner.close()
    async with awa.AsyncClient(roles.owner) as client:
        job = await client.insert({"a": 1}, kind="k")
        await client.cancel(job.id)                 # now finished history
    snoop = await asyncpg.connect(roles.reader)
    try:
        for call_sql in ("SELECT awa.drop_done_partitions(now() + interval '100 years')",
                         "SELECT awa.ensure_done_partitions(now() + interval '1 day')",
                         "SELECT awa.ensure_done_partitions(now(), now() + interval '1 day')",
                         "INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                         "max_attempts) VALUES ('k', 'q', '{}', 'available', 2, 5)",
                         "UPDATE awa.jobs_done SET kind = 'x'", "DELETE FROM awa.jobs_done",
                         "DROP TABLE awa.jobs_done_p2020010100"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await snoop.execute(call_sql)
        assert await snoop.fetchval("SELECT count(*) FROM awa.jobs_done") == 1
        assert await snoop.fetchval("SELECT to_regclass('awa.jobs_done_p2020010100')") \
            is not None
    finally:
        await snoop.close()
