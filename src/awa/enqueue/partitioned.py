"""`PartitionedQueue`: spread one hot logical queue over several physical queues.

Physical queues are ``q, q__p1, q__p2, ...`` (or names you choose with
`PartitionedQueue.from_physical_queues`). A key always routes to the same
partition in every process (BLAKE3 of the key, not Python's salted ``hash``),
and is also the job's ``ordering_key``, so related jobs stay in order. The
surface and its error messages follow `awa-pg`'s class of the same name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

import blake3

from awa.core.errors import ValidationError
from awa.core.validate import check_name

#: The most physical queues one partitioned queue may have.
MAX_PARTITIONS = 32_767


def _check_partitions(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValidationError("partitions", "partitions must be an integer")
    if count < 1:
        raise ValidationError("partitions", "partitions must be > 0")
    if count > MAX_PARTITIONS:
        raise ValidationError("partitions", f"partitions must be at most {MAX_PARTITIONS}")
    return count


def _key_bytes(key: Any) -> bytes:
    """A routing key as bytes: str (UTF-8), bytes-like, or an int or UUID (its text)."""
    if isinstance(key, int) and not isinstance(key, bool):
        if key.bit_length() > 660:  # ordering keys are at most 200 characters
            raise ValidationError("ordering_key", "an int key must have at most 198 digits")
        key = str(key)
    elif isinstance(key, UUID):
        key = str(key)
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise ValidationError("ordering_key", "ordering_key must be bytes-like or str "
                          "(or an int or UUID)")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(name, f"{name} must be > 0")
    return value


class PartitionedQueue:
    """Deterministic routing of keys to the partitions of ``logical_queue``."""

    def __init__(self, logical_queue: str, partitions: int) -> None:
        if logical_queue == "":
            raise ValidationError("logical_queue", "logical queue must not be empty")
        self.logical_queue = check_name("logical_queue", logical_queue)
        count = _check_partitions(partitions)
        self.physical_queues = [logical_queue] + [
            f"{logical_queue}__p{i}" for i in range(1, count)]
        for name in self.physical_queues:
            check_name("queue", name)

    @classmethod
    def from_physical_queues(cls, logical_queue: str,
                             physical_queues: Iterable[str]) -> PartitionedQueue:
        """A partitioned queue over queue names you already have, in routing order."""
        names = list(physical_queues)
        _check_partitions(len(names))
        seen: set[str] = set()
        for name in names:
            if name == "":
                raise ValidationError("physical_queues", "physical queue must not be empty")
            check_name("queue", name)
            if name in seen:
                raise ValidationError("physical_queues",
                                      f"physical queue {name!r} is duplicated")
            seen.add(name)
        made = cls.__new__(cls)
        if logical_queue == "":
            raise ValidationError("logical_queue", "logical queue must not be empty")
        made.logical_queue = check_name("logical_queue", logical_queue)
        made.physical_queues = names
        return made

    @property
    def partitions(self) -> int:
        """How many physical queues there are."""
        return len(self.physical_queues)

    def __len__(self) -> int:
        return len(self.physical_queues)

    def __repr__(self) -> str:
        return (f'PartitionedQueue(logical_queue="{self.logical_queue}", '
                f"partitions={self.partitions})")

    def queue_for_index(self, index: int) -> str:
        """The physical queue of partition ``index % partitions`` (round robin)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValidationError("index", "index must be an integer")
        if index < 0:
            raise ValidationError("index", "index must be >= 0")
        return self.physical_queues[index % self.partitions]

    def queue_for_key(self, key: str | bytes | int | UUID) -> str:
        """The physical queue ``key`` routes to (stable across processes)."""
        digest = int.from_bytes(blake3.blake3(_key_bytes(key)).digest(length=8), "little")
        return self.physical_queues[digest % self.partitions]

    def route_by_key(self, key: str | bytes | int | UUID) -> dict[str, str | bytes]:
        """Insert options for a keyed job: ``client.insert(args, **pq.route_by_key(k))``;
        the key (as bytes, like `awa-pg`) is also the job's ``ordering_key``."""
        data = _key_bytes(key)
        return {"queue": self.queue_for_key(data), "ordering_key": data}

    def route_by_index(self, index: int) -> dict[str, str]:
        """Insert options for round-robin routing: ``{"queue": ...}``."""
        return {"queue": self.queue_for_index(index)}

    def queue_configs(self, max_workers_per_partition: int | None = None, *,
                      min_workers_per_partition: int | None = None, weight: int = 1,
                      rate_limit_per_partition: tuple[float, int] | None = None,
                      priority_aging_interval_ms: int | None = None,
                      deadline_duration_ms: int | None = None, claimers: int | None = None,
                      claim_batch_size: int | None = None) -> list[dict[str, Any]]:
        """One ``start()`` queue config per partition: hard-reserved with
        ``max_workers_per_partition``, weighted with ``min_workers_per_partition``."""
        if max_workers_per_partition is None and min_workers_per_partition is None:
            raise ValidationError("queue_configs", "requires max_workers_per_partition "
                                  "(hard-reserved) or min_workers_per_partition (weighted)")
        if max_workers_per_partition is not None and min_workers_per_partition is not None:
            raise ValidationError("queue_configs", "use max_workers_per_partition or "
                                  "min_workers_per_partition, not both")
        common: dict[str, Any] = {}
        if max_workers_per_partition is not None:
            common["max_workers"] = _positive("max_workers_per_partition",
                                              max_workers_per_partition)
        else:
            value = min_workers_per_partition
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError("min_workers_per_partition",
                                      "min_workers_per_partition must be >= 0")
            common["min_workers"] = value
            common["weight"] = _positive("weight", weight)
        if rate_limit_per_partition is not None:
            common["rate_limit"] = rate_limit_per_partition
        if priority_aging_interval_ms is not None:
            common["priority_aging_interval_ms"] = priority_aging_interval_ms
        if deadline_duration_ms is not None:
            common["deadline_duration_ms"] = deadline_duration_ms
        if claimers is not None:
            common["claimers"] = _positive("claimers", claimers)
        if claim_batch_size is not None:
            common["claim_batch_size"] = _positive("claim_batch_size", claim_batch_size)
        return [{"name": q, **common} for q in self.physical_queues]
