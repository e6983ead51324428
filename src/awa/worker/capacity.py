"""How many handlers each queue may run right now, and how fast it may claim.

Reserved mode: each queue owns ``max_workers`` slots. Weighted mode: each
queue is guaranteed ``min_workers``; the rest of ``global_max_workers`` is
shared by weight, and a queue may borrow beyond its share only while no other
queue is waiting for slots. Rate limits are token buckets per queue, per process.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from awa.worker.config import QueueConfig, RateLimit


class Capacity:
    """Slot accounting for one worker process (single event loop, no locks)."""

    def __init__(self, queues: Iterable[QueueConfig], global_max: int | None) -> None:
        self._queues = {q.name: q for q in queues}
        self._global = global_max
        self._in_use = dict.fromkeys(self._queues, 0)
        self._hungry: set[str] = set()
        if global_max is not None:
            self._overflow = global_max - sum(q.min_workers for q in self._queues.values())
            total_weight = sum(q.weight for q in self._queues.values())
            self._share = {n: self._overflow * q.weight // total_weight
                           for n, q in self._queues.items()}

    def limit(self, queue: str) -> int:
        """The most handlers this queue could run (its own slots, or the global cap)."""
        q = self._queues[queue]
        return q.max_workers if self._global is None else q.min_workers + self._overflow

    def in_use(self, queue: str) -> int:
        return self._in_use[queue]

    def free(self, queue: str) -> int:
        """Slots this queue may take now."""
        q = self._queues[queue]
        used = self._in_use[queue]
        if self._global is None:
            return max(0, q.max_workers - used)
        own = max(0, q.min_workers - used)
        borrowed = max(0, used - q.min_workers)
        overflow_used = sum(max(0, u - self._queues[n].min_workers)
                            for n, u in self._in_use.items())
        overflow_free = max(0, self._overflow - overflow_used)
        others_waiting = any(n != queue for n in self._hungry)
        allowed = (max(0, self._share[queue] - borrowed) if others_waiting else overflow_free)
        return own + min(overflow_free, allowed)

    def set_hungry(self, queue: str, hungry: bool) -> None:
        """Mark whether ``queue`` has jobs waiting that it had no slots for."""
        if hungry:
            self._hungry.add(queue)
        else:
            self._hungry.discard(queue)

    def acquire(self, queue: str, n: int = 1) -> None:
        self._in_use[queue] += n

    def release(self, queue: str, n: int = 1) -> None:
        self._in_use[queue] -= n


class TokenBucket:
    """``max_rate`` tokens per second, holding at most ``burst``."""

    def __init__(self, rate: RateLimit) -> None:
        self._rate = rate.max_rate
        self._burst = float(rate.burst)
        self._tokens = float(rate.burst)
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now

    def available(self) -> int:
        self._refill()
        return int(self._tokens)

    def take(self, n: int) -> None:
        self._tokens -= n

    def wait_time(self) -> float:
        """Seconds until one token is available."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self._rate)
