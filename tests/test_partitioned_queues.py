"""Partitioned queues: keys route to a fixed partition (ints and strings alike), and one
key's jobs run in order."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest
from tests.helpers import FAST, wait_until

import awa


@dataclass
class Charge:
    n: int


async def test_partition_keys_may_be_ints(client: awa.AsyncClient) -> None:
    pq = awa.PartitionedQueue("orders", 4)
    routed = pq.route_by_key(42)
    assert routed == pq.route_by_key("42") and routed["queue"].startswith("orders")
    assert pq.route_by_key(uuid.UUID(int=7)) == pq.route_by_key(str(uuid.UUID(int=7)))
    job = await client.insert({"a": 1}, kind="k", **routed)  # type: ignore[arg-type]
    assert job.queue == routed["queue"] and job.ordering_key == "42"
    assert pq.route_by_key(10**197)["queue"] == pq.route_by_key(str(10**197))["queue"]
    with pytest.raises(awa.ValidationError, match="at most 198 digits"):
        pq.route_by_key(10**100_000)                 # no MemoryError, no 4300-digit error
    for bad in (object(), True, 1.5):
        with pytest.raises(awa.ValidationError, match="bytes-like or str"):
            pq.route_by_key(bad)  # type: ignore[arg-type]


async def test_partitioned_queue_routing_and_order(client: awa.AsyncClient) -> None:
    pq = awa.PartitionedQueue("emails", 4)
    assert pq.physical_queues == ["emails", "emails__p1", "emails__p2", "emails__p3"]
    assert pq.queue_for_index(5) == "emails__p1"
    assert pq.queue_for_key("customer-1") == awa.PartitionedQueue("emails", 4).queue_for_key(
        "customer-1")
    assert len({pq.queue_for_key(f"c{i}") for i in range(100)}) == 4
    assert pq.route_by_key("c1") == {"queue": pq.queue_for_key("c1"), "ordering_key": b"c1"}
    with pytest.raises(awa.ValidationError):
        awa.PartitionedQueue("emails", 0)
    order: dict[str, list[int]] = {}

    @client.task(Charge, kind="ordered", queue=pq.physical_queues[0])
    async def handle(job: awa.JobContext) -> None:
        await asyncio.sleep(0.01 * (job.args.n % 3))
        order.setdefault(job.queue + "/" + str(job.metadata["key"]), []).append(job.args.n)

    for n in range(40):
        key = f"k{n % 4}"
        await client.insert(Charge(n), kind="ordered", metadata={"key": key},
                            **pq.route_by_key(key))
    configs = pq.queue_configs(max_workers_per_partition=4)
    await client.start(configs, **FAST)

    async def done() -> bool:
        return sum(len(v) for v in order.values()) == 40
    await wait_until(done, timeout=20)
    for seq in order.values():
        assert seq == sorted(seq)  # each key ran strictly in insertion order
