"""Producer backpressure: ``backpressure="off" | "signal" | Reject(limit)`` on every
enqueue path, inside transactions, and the paced producer against a draining worker."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from tests.helpers import FAST, wait_until
from tests.test_telemetry import Otel, otel  # noqa: F401  (the fixture)

import awa
from awa.core import states


@dataclass
class Item:
    n: int


async def _available(client: awa.AsyncClient, queue: str) -> int:
    pool = await client.pool()
    n: int = await pool.fetchval(
        "SELECT count(*) FROM awa.jobs_active WHERE queue = $1 AND state = 'available'", queue)
    return n


async def test_off_is_the_default_and_measures_nothing(client: awa.AsyncClient) -> None:
    job = await client.insert(Item(1), queue="q")
    assert job.queue_depth is None and dict(client.queue_depths) == {}
    assert (await client.insert(Item(2), queue="q", backpressure="off")).queue_depth is None


async def test_signal_reports_the_depth_before_the_insert(client: awa.AsyncClient) -> None:
    await client.enqueue_many_copy([Item(n) for n in range(5)], queue="q")
    job = await client.insert(Item(9), queue="q", backpressure="signal")
    assert job.queue_depth == awa.QueueDepth("q", 5, states.DEPTH_SIGNAL_CAP)
    assert not job.queue_depth.at_least
    assert client.queue_depths["q"].depth == 5
    await client.enqueue_many_copy([Item(0)], queue="other", backpressure="signal")
    assert client.queue_depths["other"].depth == 0 and client.queue_depths["q"].depth == 5
    jobs = await client.insert_many_copy([Item(1), Item(2)], queue="q", backpressure="signal")
    assert [j.queue_depth.depth for j in jobs if j.queue_depth] == [6, 6]
    # Scheduled jobs are not depth: only what workers could claim now.
    await client.insert(Item(3), queue="q", run_at="2999-01-01T00:00:00Z")
    assert (await client.queue_depth("q")).depth == 8
    assert (await client.queue_depth("q", cap=3)) == awa.QueueDepth("q", 3, 3)
    assert (await client.queue_depth("q", cap=3)).at_least


async def test_reject_raises_before_anything_is_written(client: awa.AsyncClient) -> None:
    await client.enqueue_many_copy([Item(n) for n in range(5)], queue="q")
    with pytest.raises(awa.QueueFull) as caught:
        await client.insert(Item(5), queue="q", backpressure=awa.Reject(5))
    assert (caught.value.queue, caught.value.depth, caught.value.limit) == ("q", 5, 5)
    with pytest.raises(awa.QueueFull):
        await client.insert_many_copy([Item(6), Item(7)], queue="q", backpressure=awa.Reject(3))
    with pytest.raises(awa.QueueFull):
        await client.enqueue_many_copy([Item(8)], queue="q", backpressure=awa.Reject(1))
    # One full queue refuses the whole call, the other queue's jobs included.
    with pytest.raises(awa.QueueFull):
        await client.insert_many_copy([Item(9), Item(10)], opts=[{"queue": "empty"}, None],
                                      queue="q", backpressure=awa.Reject(5))
    assert await _available(client, "q") == 5 and await _available(client, "empty") == 0
    job = await client.insert(Item(11), queue="q", backpressure=awa.Reject(6))
    assert job.queue_depth is not None and job.queue_depth.depth == 5
    assert await client.enqueue_many_copy([Item(12), Item(13)], queue="q",
                                          backpressure=awa.Reject(7)) == 2
    assert await _available(client, "q") == 8


async def test_bad_options_are_refused_before_writing(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError, match="backpressure"):
        await client.insert(Item(1), queue="q", backpressure="on")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match=r"backpressure\.limit"):
        awa.Reject(0)
    with pytest.raises(awa.ValidationError, match="target_depth"):
        client.paced("q", 0)
    assert await _available(client, "q") == 0


async def test_in_a_transaction(client: awa.AsyncClient) -> None:
    await client.enqueue_many_copy([Item(n) for n in range(2)], queue="q")
    async with client.transaction() as tx:
        await tx.insert(Item(2), queue="q")
        # The check sees committed jobs plus this transaction's own.
        with pytest.raises(awa.QueueFull) as caught:
            await tx.insert(Item(3), queue="q", backpressure=awa.Reject(3))
        assert caught.value.depth == 3
        # Caught, the transaction goes on (the refused job was never written).
        signalled = await tx.insert_many([Item(4)], queue="q", backpressure="signal")
        assert signalled[0].queue_depth is not None and signalled[0].queue_depth.depth == 3
    assert await _available(client, "q") == 4
    # Uncaught, it rolls the whole transaction back, earlier inserts included.
    with pytest.raises(awa.QueueFull):
        async with client.transaction() as tx:
            await tx.insert(Item(5), queue="q")
            await tx.insert(Item(6), queue="q", backpressure=awa.Reject(4))
    assert await _available(client, "q") == 4
    # Another producer's uncommitted jobs are not counted.
    other = await client.transaction()
    try:
        await other.insert_many([Item(n) for n in range(10)], queue="q")
        job = await client.insert(Item(7), queue="q", backpressure=awa.Reject(5))
        assert job.queue_depth is not None and job.queue_depth.depth == 4
    finally:
        await other.rollback()


def test_sync_client_backpressure(sync_client: awa.Client) -> None:
    sync_client.enqueue_many_copy([Item(n) for n in range(3)], queue="q")
    with pytest.raises(awa.QueueFull):
        sync_client.insert(Item(3), queue="q", backpressure=awa.Reject(3))
    job = sync_client.insert(Item(4), queue="q", backpressure="signal")
    assert job.queue_depth is not None and job.queue_depth.depth == 3
    assert sync_client.queue_depths["q"].depth == 3
    assert sync_client.queue_depth("q").depth == 4
    with sync_client.paced("q", target_depth=5, max_wait=0.05) as pacer:
        assert pacer.enqueue_many([Item(5)]) == 1  # depth 4 < 5: room
        with pytest.raises(awa.QueueFull):
            pacer.insert(Item(6))                   # depth 5: no room within max_wait
        assert pacer.pacer.inserted == 1


async def test_paced_producer_keeps_the_queue_near_its_target(client: awa.AsyncClient) -> None:
    target, batch, total = 200, 50, 1500

    @client.task(Item, queue="paced")
    async def work(job: awa.JobContext) -> None:
        await asyncio.sleep(0.002)

    await client.start([("paced", 4)], **FAST)
    deepest = 0
    async with client.paced("paced", target_depth=target) as pacer:
        for start in range(0, total, batch):
            await pacer.enqueue_many([Item(n) for n in range(start, start + batch)])
            deepest = max(deepest, await _available(client, "paced"))
        assert pacer.inserted == total and pacer.paused_seconds > 0
        with pytest.raises(awa.ValidationError, match="queue"):
            await pacer.insert(Item(0), queue="elsewhere")
    # Never much past the target: it waits for room before each batch.
    assert deepest <= target + batch
    pool = await client.pool()
    await wait_until(lambda: _done(pool, total), timeout=60, message="the worker to drain")


async def _done(pool: object, total: int) -> bool:
    n = await pool.fetchval("SELECT count(*) FROM awa.jobs_done")  # type: ignore[attr-defined]
    return bool(n == total)


async def test_paced_max_wait_gives_up(client: awa.AsyncClient) -> None:
    await client.enqueue_many_copy([Item(n) for n in range(3)], queue="stuck")
    pacer = client.paced("stuck", 3, max_wait=0.1)
    with pytest.raises(awa.QueueFull):
        await pacer.insert(Item(3))
    assert await _available(client, "stuck") == 3


def test_cli_queue_depth(database_url: str) -> None:
    from tests.test_cli import awa_cli

    with awa.Client(database_url) as c:
        c.enqueue_many_copy([Item(n) for n in range(4)], queue="cliq")
    result = awa_cli(database_url, "queue", "depth", "cliq", "--json")
    assert json.loads(result.stdout) == {"queue": "cliq", "depth": 4,
                                         "cap": states.DEPTH_SIGNAL_CAP, "at_least": False}
    result = awa_cli(database_url, "queue", "depth", "cliq", "--cap", "2")
    assert result.stdout.strip() == "cliq: >= 2 available"


async def test_signalled_and_rejected_counters(
        client: awa.AsyncClient, otel: Otel) -> None:  # noqa: F811  (the fixture)
    await client.insert_many_copy([Item(1), Item(2)], queue="m", backpressure="signal")
    with pytest.raises(awa.QueueFull):
        await client.enqueue_many_copy([Item(3)] * 3, queue="m", backpressure=awa.Reject(2))
    await client.insert(Item(4), queue="m")  # "off": counted nowhere
    assert otel.value("awa.enqueue.signalled", kind="item", queue="m") == 2
    assert otel.value("awa.enqueue.rejected", kind="item", queue="m") == 3
