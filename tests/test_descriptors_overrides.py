"""Descriptors (live / stale / drifted) and live queue overrides."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, ROOT, wait_for_state, wait_until

import awa


@dataclass
class Slow:
    seconds: float


def declare(client: awa.AsyncClient, owner: str) -> None:
    client.queue_descriptor("mail", display_name="Mail", owner=owner,
                            docs_url="https://runbooks.example/mail", tags=["io"])
    client.job_kind_descriptor("slow", description="sleeps", owner=owner)

    @client.task(Slow, queue="mail")
    async def slow(job: awa.Job) -> None:
        await asyncio.sleep(job.args.seconds)


async def statuses(client: awa.AsyncClient) -> dict[tuple[str, str], str]:
    return {(d["scope"], d["name"]): d["status"] for d in await client.list_descriptors()}


async def test_descriptor_live_drifted_then_stale(database_url: str) -> None:
    a, b = awa.AsyncClient(database_url), awa.AsyncClient(database_url)
    try:
        declare(a, owner="team-a")
        await a.start([("mail", 1)], **FAST)
        assert await statuses(a) == {("kind", "slow"): "live", ("queue", "mail"): "live"}
        rows = await a.list_descriptors("queue")
        assert rows[0]["descriptor"]["owner"] == "team-a" and rows[0]["live_instances"] == 1

        declare(b, owner="team-b")  # a second worker disagrees about the owner
        await b.start([("mail", 1)], **FAST)
        assert (await statuses(a))[("queue", "mail")] == "drifted"

        await b.shutdown()
        assert (await statuses(a))[("queue", "mail")] == "live"
        await a.shutdown()  # the last worker declaring them stops
        assert await statuses(a) == {("kind", "slow"): "stale", ("queue", "mail"): "stale"}
    finally:
        await a.close()
        await b.close()


async def test_descriptor_validation() -> None:
    client = awa.AsyncClient("postgresql://unused/db")
    with pytest.raises(awa.ValidationError) as err:
        client.queue_descriptor("mail", owner=42)  # type: ignore[arg-type]
    assert err.value.field == "owner"
    with pytest.raises(awa.ValidationError):
        client.job_kind_descriptor("", owner="x")
    with pytest.raises(awa.ValidationError) as err:
        client.queue_descriptor("mail", tags="io")  # type: ignore[arg-type]
    assert err.value.field == "tags"


async def test_override_picked_up_by_running_worker(client: awa.AsyncClient,
                                                    conn: asyncpg.Connection) -> None:
    # The attempt's own deadline, and when the handler began (a completed row keeps none).
    seen: dict[int, tuple[datetime | None, datetime]] = {}

    @client.task(Slow, queue="mail")
    async def slow(job: awa.JobContext) -> None:
        seen[job.id] = (job.deadline_datetime, datetime.now(UTC))
        await asyncio.sleep(job.args.seconds)
    await client.start([("mail", 2)], **FAST)
    runtime: Any = client._runtime
    first = await client.insert(Slow(0), queue="mail")
    await wait_for_state(client, first.id, awa.JobState.Completed)
    deadline, began = seen[first.id]
    assert deadline is not None
    assert deadline - began >= timedelta(minutes=4)  # the default deadline is 5 minutes

    ov = await client.set_queue_override("mail", deadline_ms=1500, claim_batch_size=1,
                                         rate_limit="50/5", poll_interval_ms=250,
                                         updated_by="ops")
    assert ov["rate_limit"] == {"max_rate": 50.0, "burst": 5} and ov["updated_by"] == "ops"
    dispatcher = runtime.dispatchers["mail"]
    await wait_until(lambda: _async(dispatcher.cfg.claim_batch_size == 1), timeout=10,
                     message="the worker to apply the override")
    assert dispatcher._poll == 0.25 and dispatcher.cfg.rate_limit.burst == 5

    second = await client.insert(Slow(0), queue="mail")
    await wait_for_state(client, second.id, awa.JobState.Completed)
    deadline, began = seen[second.id]
    assert deadline is not None
    assert 0.5 < (deadline - began).total_seconds() <= 1.5  # the override's 1500 ms

    # Partial clear keeps the rest; clearing everything restores the start() config.
    assert await client.clear_queue_override("mail", ["claim_batch_size"])
    [left] = await client.queue_overrides("mail")
    assert left["claim_batch_size"] is None and left["deadline_ms"] == 1500
    assert await client.clear_queue_override("mail")
    assert await client.queue_overrides() == []
    assert not await client.clear_queue_override("mail")
    await wait_until(lambda: _async(dispatcher.cfg.deadline == runtime.config.queues[0].deadline
                                    and dispatcher.cfg.rate_limit is None), timeout=10,
                     message="the override to be lifted")
    await client.shutdown()


async def _async(value: bool) -> bool:
    return value


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"poll_interval_ms": 0}, "poll_interval_ms"),
    ({"claim_batch_size": 5000}, "claim_batch_size"),
    ({"claim_batch_size": True}, "claim_batch_size"),
    ({"rate_limit": -1}, "rate_limit"),
    ({"rate_limit": "fast"}, "rate_limit"),
    ({"rate_limit": float("nan")}, "rate_limit"),
    ({"rate_limit": "5/0"}, "rate_limit.burst"),
    ({"deadline_ms": -5}, "deadline_ms"),
    ({}, "override"),
])
async def test_invalid_overrides_are_refused(client: awa.AsyncClient, kwargs: dict[str, Any],
                                             field: str) -> None:
    with pytest.raises(awa.ValidationError) as err:
        await client.set_queue_override("mail", **kwargs)
    assert err.value.field == field
    assert await client.queue_overrides() == []
    with pytest.raises(awa.ValidationError):
        await client.clear_queue_override("mail", ["bogus"])


def test_sync_client_overrides(database_url: str) -> None:
    with awa.Client(database_url) as c:
        c.set_queue_override("mail", poll_interval_ms=500)
        assert c.queue_overrides()[0]["poll_interval_ms"] == 500
        assert c.clear_queue_override("mail")
        assert c.list_descriptors() == []


def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awa", "--database-url", database_url, *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


async def test_cli_overrides_and_descriptors(client: awa.AsyncClient, database_url: str) -> None:
    def go() -> None:
        r = run_cli(database_url, "queue", "overrides", "set", "mail", "--rate-limit", "10/2",
                    "--deadline-ms", "2000", "--by", "ops", "--create", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        [row] = json.loads(r.stdout)
        assert row["rate_limit"] == {"max_rate": 10.0, "burst": 2} and row["deadline_ms"] == 2000

        r = run_cli(database_url, "queue", "overrides", "set", "mail", "--claim-batch-size",
                    "0", "--yes")
        assert r.returncode == 1 and "claim_batch_size" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        r = run_cli(database_url, "queue", "overrides", "set", "mail", "--deadline-ms", "1")
        assert r.returncode == 1 and "not confirmed" in r.stderr  # no terminal: no

        r = run_cli(database_url, "queue", "overrides", "show")
        assert r.returncode == 0 and "mail" in r.stdout and "ops" in r.stdout
        r = run_cli(database_url, "queue", "overrides", "clear", "mail", "--field",
                    "rate_limit", "--yes")
        assert r.returncode == 0 and "cleared" in r.stdout
        r = run_cli(database_url, "queue", "overrides", "show", "mail", "--json")
        [row] = json.loads(r.stdout)
        assert row["rate_limit"] is None and row["deadline_ms"] == 2000

        r = run_cli(database_url, "descriptors", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)[0]["status"] == "stale"
    declare(client, owner="team-a")
    await client.start([("mail", 1)], **FAST)
    await client.shutdown()
    await asyncio.to_thread(go)
