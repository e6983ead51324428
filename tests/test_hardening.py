"""One bad job must never stop a queue (issue 28: run_at extremes, nesting, size,
unknown kinds, claims that keep failing)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import psycopg
import pytest
from tests.helpers import FAST, wait_for_state, wait_until

import awa
from awa.core import serialize, states
from awa.db import migrations
from awa.db.queries import bind_schema
from awa.enqueue import bridge

EXTREMES = [datetime.min, datetime.max, datetime.min.replace(tzinfo=UTC),
            datetime.max.replace(tzinfo=UTC),
            datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=6))),
            datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-6)))]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


async def _count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM awa.jobs"))


@pytest.mark.parametrize("run_at", EXTREMES)
async def test_run_at_extremes_are_refused_everywhere(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection,
                                                      database_url: str,
                                                      run_at: datetime) -> None:
    attempts = [
        lambda: client.insert({"a": 1}, kind="k", run_at=run_at),
        lambda: client.insert_many_copy([{"a": 1}], kind="k", run_at=run_at),
        lambda: client.enqueue_many_copy([{"a": 1}], kind="k", run_at=run_at),
        lambda: client.insert_many_copy([{"a": 1}], kind="k", opts=[{"run_at": run_at}]),
    ]
    for attempt in attempts:
        with pytest.raises(awa.ValidationError) as err:
            await attempt()
        assert err.value.field == "run_at" and "0001-01-02" in err.value.rule
    async with client.transaction() as tx:
        with pytest.raises(awa.ValidationError):
            await tx.insert({"a": 1}, kind="k", run_at=run_at)
    with psycopg.connect(database_url) as pg, pytest.raises(awa.ValidationError):
        bridge.insert_job_sync(pg, {"a": 1}, kind="k", run_at=run_at)
    assert await _count(conn) == 0


async def test_run_at_edges_of_the_range_are_accepted(client: awa.AsyncClient) -> None:
    early = await client.insert({"a": 1}, kind="k", run_at=states.RUN_AT_MIN)
    late = await client.insert({"a": 1}, kind="k", run_at=states.RUN_AT_MAX)
    assert early.state is awa.JobState.Available and early.run_at_datetime == states.RUN_AT_MIN
    assert late.state is awa.JobState.Scheduled and late.run_at_datetime == states.RUN_AT_MAX


async def test_dlq_retry_refuses_infinite_run_at(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError) as err:
        await client.retry_from_dlq(1, run_at=datetime.max)
    assert err.value.field == "run_at"


async def test_the_schema_refuses_infinite_run_at(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                           "max_attempts, run_at) VALUES ('k', 'q', '{}', 'available', 2, 5, "
                           "'-infinity')")


async def test_a_stored_infinite_row_does_not_stop_its_queue(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    # A row written before the CHECK existed (or by another writer without it).
    await conn.execute("ALTER DOMAIN awa.job_run_at DROP CONSTRAINT job_run_at_check")
    for run_at in ("-infinity", "infinity"):
        await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                           "max_attempts, run_at) "
                           "VALUES ('step', 'q', '{}', $1, 2, 5, $2::text::timestamptz)",
                           "available" if run_at == "-infinity" else "scheduled", run_at)
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["q"].available == 1 and stats["q"].scheduled == 1
    ids = [(await client.insert({"n": i}, kind="step", queue="q")).id for i in range(5)]
    ran: list[int] = []

    @client.task(kind="step", queue="q")
    async def step(job: awa.Job) -> None:
        ran.append(job.id)

    await client.start([("q", 4)], **FAST)  # priority aging is on by default
    try:
        for job_id in ids:
            await wait_for_state(client, job_id, awa.JobState.Completed)
        assert (await client.health_check()).healthy
        assert await client.queue_stats()
        # The row no Job can be built from was failed, not left to block its batch.
        bad = await wait_until(lambda: conn.fetchval(
            "SELECT id FROM awa.jobs_done WHERE kind = 'step' AND state = 'failed'"))
        assert "cannot be decoded" in (await client.get_job(bad)).errors[0]["error"]
    finally:
        await client.shutdown()
    assert sorted(ran) == ids


async def test_migration_moves_stored_infinities_to_finite_times(
        empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        before = [m for m in migrations.migrations() if m[0] < 9]
        async with conn.transaction():
            await conn.execute("CREATE SCHEMA awa")
            await conn.execute("CREATE TABLE awa.schema_migrations (version integer PRIMARY "
                               "KEY, description text NOT NULL, applied_at timestamptz NOT "
                               "NULL DEFAULT now())")
            for version, description, sql in before:
                await conn.execute(bind_schema(sql, "awa"))
                await conn.execute("INSERT INTO awa.schema_migrations VALUES ($1, $2)",
                                   version, description)
        for run_at in ("-infinity", "infinity"):
            await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                               "max_attempts, run_at) VALUES ('k', 'q', '{}', 'scheduled', 2, "
                               "5, $1::text::timestamptz)", run_at)
        await awa.migrate(empty_database_url)
        rows = await conn.fetch("SELECT run_at, isfinite(run_at) AS ok FROM awa.jobs "
                                "ORDER BY run_at")
        assert [r["ok"] for r in rows] == [True, True]
        assert rows[1]["run_at"] == states.RUN_AT_MAX
    finally:
        await conn.close()


async def test_claims_that_keep_failing_make_the_worker_unhealthy(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    # Every claim on queue "broken" fails; "fine" keeps working.
    await conn.execute("""
        CREATE FUNCTION public.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'claims of % are broken', NEW.queue; END $$;
        CREATE TRIGGER refuse_claim BEFORE UPDATE ON awa.jobs FOR EACH ROW
            WHEN (NEW.queue = 'broken' AND NEW.state = 'running')
            EXECUTE FUNCTION public.refuse_claim();""")
    await client.insert({"n": 1}, kind="step", queue="broken")
    ok = await client.insert({"n": 2}, kind="step", queue="fine")

    @client.task(kind="step", queue="fine")
    async def step(job: awa.Job) -> None:
        return None

    await client.start([("fine", 2), ("broken", 2)], **FAST)
    try:
        await wait_for_state(client, ok.id, awa.JobState.Completed)

        async def unhealthy() -> awa.HealthCheck | None:
            health = await client.health_check()
            return None if health.healthy else health
        health = await wait_until(unhealthy, message="an unhealthy report")
        assert health.postgres_connected and health.poll_loop_alive
        broken = health.queues["broken"]
        assert broken.claim_failures >= states.CLAIM_FAILURES_UNHEALTHY
        assert "claims of broken are broken" in (broken.last_claim_error or "")
        assert health.queues["fine"].claim_failures == 0
    finally:
        await client.shutdown()


@pytest.mark.parametrize("depth", [states.JSON_MAX_DEPTH + 1, 990, 5000])
async def test_deep_nesting_is_a_validation_error(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection,
                                                  database_url: str, depth: int) -> None:
    deep = _nested(depth)
    for attempt in (lambda: client.insert({"a": deep}, kind="k"),
                    lambda: client.insert({"a": 1}, kind="k", metadata={"m": deep}),
                    lambda: client.insert_many_copy([{"a": deep}], kind="k"),
                    lambda: client.enqueue_many_copy([{"a": deep}], kind="k"),
                    lambda: client.insert({"a": deep}, kind="k", unique_opts={})):
        with pytest.raises(awa.ValidationError) as err:
            await attempt()
        assert "nested deeper than 128" in err.value.rule
    with psycopg.connect(database_url) as pg, pytest.raises(awa.ValidationError):
        bridge.insert_job_sync(pg, {"a": deep}, kind="k")
    assert await _count(conn) == 0


async def test_nesting_up_to_the_limit_round_trips(client: awa.AsyncClient) -> None:
    deep = _nested(states.JSON_MAX_DEPTH - 1)  # inside the args object: depth 128
    job = await client.insert({"a": deep, "s": "[[[[" * 200}, kind="k")
    assert (await client.get_job(job.id)).args == {"a": deep, "s": "[[[[" * 200}


async def test_payload_cap(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    assert serialize.max_payload_bytes() == states.PAYLOAD_MAX_BYTES
    big = "x" * (states.PAYLOAD_MAX_BYTES + 1)
    with pytest.raises(awa.ValidationError) as err:
        await client.insert({"a": big}, kind="k")
    assert err.value.field == "args" and str(states.PAYLOAD_MAX_BYTES) in err.value.rule
    with pytest.raises(awa.ValidationError) as err:
        await client.insert({"a": 1}, kind="k", metadata={"m": big})
    assert err.value.field == "metadata"
    with pytest.raises(awa.ValidationError):  # multi-byte text is measured in bytes
        await client.insert({"a": "é" * (states.PAYLOAD_MAX_BYTES // 2)}, kind="k")
    with pytest.raises(awa.ValidationError):
        await client.enqueue_many_copy([{"a": 1}, {"a": big}], kind="k")
    assert await _count(conn) == 0
    try:
        awa.set_max_payload_bytes(100)
        with pytest.raises(awa.ValidationError):
            await client.insert({"a": "y" * 100}, kind="k")
        awa.set_max_payload_bytes(None)
        await client.insert({"a": big}, kind="k")
        with pytest.raises(awa.ValidationError):
            awa.set_max_payload_bytes(0)
    finally:
        awa.set_max_payload_bytes(states.PAYLOAD_MAX_BYTES)
    assert await _count(conn) == 1


async def test_callback_payloads_are_capped_and_depth_checked(client: awa.AsyncClient) -> None:
    for payload in ({"p": "x" * (states.PAYLOAD_MAX_BYTES + 1)}, {"p": _nested(1000)}):
        with pytest.raises(awa.ValidationError):
            await client.complete_external("00000000-0000-0000-0000-000000000000", payload)


async def test_unknown_kind_is_retried_for_a_newer_worker(client: awa.AsyncClient,
                                                          database_url: str) -> None:
    job = await client.insert({"x": 1}, kind="added_in_v2", queue="q", max_attempts=5)

    @client.task(kind="known", queue="q")
    async def known(job: awa.Job) -> None:
        return None

    await client.start([("q", 2)], **FAST)
    try:
        retried = await wait_for_state(client, job.id, awa.JobState.Retryable)
    finally:
        await client.shutdown()
    assert retried.attempt == 1 and "UnknownJobKind" in retried.errors[0]["error"]
    assert "terminal" not in retried.errors[0]
    assert retried.run_at_datetime > datetime.now(UTC)  # backoff, not an immediate hot loop

    async with awa.AsyncClient(database_url) as newer:
        ran: list[dict[str, Any]] = []

        @newer.task(kind="added_in_v2", queue="q")
        async def handle(job: awa.Job) -> None:
            ran.append(job.args)

        await newer.start([("q", 2)], **FAST)
        try:
            done = await wait_for_state(newer, job.id, awa.JobState.Completed, timeout=30)
        finally:
            await newer.shutdown()
    assert done.attempt == 2 and ran == [{"x": 1}]


def test_payload_cap_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "2048")
    assert serialize._limit_from_env() == 2048
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "none")
    assert serialize._limit_from_env() is None
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "lots")
    with pytest.raises(awa.ValidationError) as err:
        serialize._limit_from_env()
    assert err.value.field == "AWA_MAX_PAYLOAD_BYTES"
    assert json.loads(serialize.dumps({"a": 1}, "args")) == {"a": 1}


async def test_a_stored_row_too_deep_to_decode_fails_alone(client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    # Only another writer can store this (Awa refuses it); Python cannot decode it.
    await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts)"
                       " VALUES ('step', 'q', $1::text::jsonb, 'available', 1, 5)",
                       '{"a":' + "[" * 3000 + "]" * 3000 + "}")
    bad = await conn.fetchval("SELECT id FROM awa.jobs")
    good = [(await client.insert({"n": i}, kind="step", queue="q")).id for i in range(3)]
    assert (await client.get_job(bad)).args == {}  # readable, though not decodable

    @client.task(kind="step", queue="q")
    async def step(job: awa.Job) -> None:
        return None

    await client.start([("q", 2)], **FAST)
    try:
        for job_id in good:
            await wait_for_state(client, job_id, awa.JobState.Completed)
        failed = await wait_for_state(client, bad, awa.JobState.Failed)
    finally:
        await client.shutdown()
    assert "nested too deeply" in failed.errors[0]["error"] and failed.errors[0]["terminal"]


async def test_held_connection_survives_a_backend_killed_while_idle(database_url: str) -> None:
    """The claim loop's and the completion writer's held connection: when the server
    ends it between statements (a restart, pg_terminate_backend), the next statement
    runs on a fresh connection instead of failing once with "released back to the pool"."""
    from awa.db.pool import HeldConnection

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    killer = await asyncpg.connect(database_url)
    try:
        held = HeldConnection(pool)
        pid = (await held.fetch("SELECT pg_backend_pid() AS pid"))[0]["pid"]
        await killer.execute("SELECT pg_terminate_backend($1)", pid)

        async def released() -> bool:
            return "released" in repr(held._conn)
        await wait_until(released, message="asyncpg to notice the killed backend")
        rows = await held.fetch("SELECT pg_backend_pid() AS pid")
        assert rows[0]["pid"] != pid
        assert await held.execute("SELECT 1") == "SELECT 1"
        await held.release()
    finally:
        await killer.close()
        await pool.close()
