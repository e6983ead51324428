"""`PartitionedQueue`: spread one hot logical queue over several physical queues.

Physical queues are ``q, q__p1, q__p2, ...``. A key always routes to the same
partition in every process (BLAKE3 of the key, not Python's salted ``hash``),
and is also the job's ``ordering_key``, so related jobs stay in order.
"""

from __future__ import annotations

from typing import Any

import blake3

from awa.producer import check_int, check_name


class PartitionedQueue:
    """Deterministic routing of keys to the partitions of ``logical_queue``."""

    def __init__(self, logical_queue: str, partitions: int) -> None:
        self.logical_queue = check_name("logical_queue", logical_queue)
        self.partitions = check_int("partitions", partitions, 1, 4096)
        self.physical_queues = [logical_queue] + [
            f"{logical_queue}__p{i}" for i in range(1, partitions)]
        for name in self.physical_queues:
            check_name("queue", name)

    def __repr__(self) -> str:
        return (f'PartitionedQueue(logical_queue="{self.logical_queue}", '
                f"partitions={self.partitions})")

    def queue_for_index(self, index: int) -> str:
        """The physical queue of partition ``index % partitions``."""
        check_int("index", index, 0, 2**63 - 1)
        return self.physical_queues[index % self.partitions]

    def queue_for_key(self, key: str | bytes) -> str:
        """The physical queue ``key`` routes to (stable across processes)."""
        data = key.encode() if isinstance(key, str) else bytes(key)
        digest = int.from_bytes(blake3.blake3(data).digest(length=8), "little")
        return self.physical_queues[digest % self.partitions]

    def route_by_key(self, key: str) -> dict[str, str]:
        """Insert options for a keyed job: ``client.insert(args, **pq.route_by_key(k))``."""
        return {"queue": self.queue_for_key(key), "ordering_key": key}

    def queue_configs(self, max_workers_per_partition: int = 1,
                      **extra: Any) -> list[dict[str, Any]]:
        """One ``start()`` queue config per partition."""
        check_int("max_workers_per_partition", max_workers_per_partition, 1, 10_000)
        return [{"name": q, "max_workers": max_workers_per_partition, **extra}
                for q in self.physical_queues]
