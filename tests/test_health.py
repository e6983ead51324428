"""Health checks: what they say without a worker, and a queue whose claims keep
failing makes the worker unhealthy while the other queues go on."""

from __future__ import annotations

import asyncpg
from tests.helpers import FAST, wait_for_state, wait_until

import awa
from awa.core import states


async def test_claims_that_keep_failing_make_the_worker_unhealthy(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    # Every claim on queue "broken" fails; "fine" keeps working.
    await conn.execute("""
        CREATE FUNCTION public.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'claims of % are broken', NEW.queue; END $$;
        CREATE TRIGGER refuse_claim BEFORE UPDATE ON awa.jobs FOR EACH ROW
            WHEN (NEW.queue = 'broken' AND NEW.state = 'running')
            EXECUTE FUNCTION public.refuse_claim();
        -- A ring job's claim writes a receipt instead (unless AWA_TEST_RING=0).
        CREATE TRIGGER refuse_ring_claim BEFORE INSERT ON awa.receipts FOR EACH ROW
            WHEN (NEW.queue = 'broken')
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


async def test_health_without_a_worker_speaks_for_the_database(
        client: awa.AsyncClient, empty_database_url: str) -> None:
    health = await client.health_check()
    assert health.healthy and health.postgres_connected and health.schema_compatible
    assert health.runtime == "not running" and not health.poll_loop_alive
    async with awa.AsyncClient(empty_database_url) as unmigrated:
        health = await unmigrated.health_check()
    assert health.postgres_connected and not health.healthy
    assert health.schema_compatible is False

    @client.task(kind="k", queue="q")
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([("q", 1)], **FAST)
    try:
        assert (await client.health_check()).runtime == "running"
    finally:
        await client.shutdown()
