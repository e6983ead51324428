"""Cron schedules with a concurrency key: validated like an insert, and every
job they fire carries the key and obeys its max_in_flight
(docs/guide/concurrency-keys.md, "Cron")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
import pytest
from tests.helpers import FAST, wait_until

import awa
from awa.db.queries import queries
from awa.maintenance.cron import CronService
from awa.telemetry.signals import Signals


@dataclass
class Sync:
    tenant: str = "acme"


def test_invalid_key_options_raise_at_declaration() -> None:
    client = awa.AsyncClient("postgresql://unused/db")
    with pytest.raises(awa.ValidationError, match="max_in_flight"):
        client.periodic("a", "* * * * *", Sync, Sync(), max_in_flight=2)  # no key
    with pytest.raises(awa.ValidationError, match="max_in_flight"):
        client.periodic("a", "* * * * *", Sync, Sync(), concurrency_key="k", max_in_flight=0)
    with pytest.raises(awa.ValidationError, match="concurrency_key"):
        client.periodic("a", "* * * * *", Sync, Sync(), concurrency_key="")
    with pytest.raises(awa.ValidationError, match="concurrency_key"):
        client.periodic("a", "* * * * *", Sync, Sync(), concurrency_key="x" * 201)
    client.periodic("ok", "* * * * *", Sync, Sync(), concurrency_key="k", max_in_flight=3)
    client.periodic("key-only", "* * * * *", Sync, Sync(), concurrency_key="k")


async def test_fired_jobs_carry_the_key_and_obey_the_limit(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals) -> None:
    """Five missed fire times caught up at once: five jobs of one key with
    max_in_flight=1 on a queue of four slots run one at a time."""
    running = peak = 0
    release = asyncio.Event()

    @client.task(Sync, queue="cronk")
    async def handle(job: awa.Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    client.periodic("tenant-sync", "0 0 1 1 *", Sync, Sync(), queue="cronk",
                    concurrency_key="tenant:acme", max_in_flight=1,
                    missed_fire_policy="catch_up")
    await client.start([("cronk", 4)], **FAST)
    listed = {c["name"]: c for c in await client.list_cron_jobs()}["tenant-sync"]
    assert (listed["concurrency_key"], listed["max_in_flight"]) == ("tenant:acme", 1)
    # Every second for the last 5.4 s, as if the leader had been away.
    await conn.execute("UPDATE awa.cron_jobs SET cron_expr = '* * * * * *', "
                       "last_fire_at = date_trunc('second', now()) - interval '5.4 s' "
                       "WHERE name = 'tenant-sync'")
    service = CronService(await client.pool(), queries(), timedelta(seconds=1), lambda: True)
    await service.run_once()
    keys = await conn.fetch("SELECT concurrency_key, concurrency_limit FROM awa.jobs")
    assert len(keys) >= 5
    assert {(r["concurrency_key"], r["concurrency_limit"]) for r in keys} == {("tenant:acme", 1)}
    await wait_until(lambda: asyncio.sleep(0, peak == 1), message="first job running")
    # The other jobs wait for the key's one slot although three slots are free.
    for _ in range(3):
        await signals.claims("cronk")  # a claim since, which took none of them
        in_flight = await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'running'")
        assert in_flight == 1 and peak == 1
    release.set()

    async def finished() -> bool:
        left = await conn.fetchval("SELECT count(*) FROM awa.jobs")
        return bool(left == 0)
    await wait_until(finished, message="every fired job completed")
    assert peak == 1
    done = await conn.fetch("SELECT concurrency_key, concurrency_slot FROM awa.jobs_done")
    assert {(r["concurrency_key"], r["concurrency_slot"]) for r in done} == {("tenant:acme", 1)}
    job = await client.trigger_cron_job("tenant-sync")
    assert (job.concurrency_key, job.concurrency_limit) == ("tenant:acme", 1)
