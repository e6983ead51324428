"""`Pacer`: a bulk loader's enqueue that keeps one queue near a target depth.

``client.paced(queue, target_depth=...)`` returns one. Before each insert it
counts the queue's available jobs (a bounded count on the claim index, as
``backpressure="signal"`` does) and, while the queue holds ``target_depth``
or more, sleeps instead of writing: the loader goes as fast as the workers
drain and no faster, and the backlog stays between about the target and the
target plus one batch. The sleep adapts: from the drop in depth between two
looks it estimates how long the workers need to get below the target, within
``min_sleep``..``max_sleep``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from awa.core import states
from awa.core.backpressure import QueueDepth
from awa.core.errors import QueueFull, ValidationError
from awa.core.results import InsertedJob
from awa.core.validate import check_int, check_name, check_seconds

DepthFn = Callable[[str, int], Awaitable[QueueDepth]]


class Pacer:
    """Enqueue into ``queue`` no faster than it drains (see the module docstring).

    ``max_wait``: give up with `QueueFull` after waiting that long for room in
    one call (None: wait as long as it takes). Counters for the loader's logs:
    ``inserted``, ``paused_seconds``, ``last_depth``.
    """

    def __init__(self, queue: str, target_depth: int, depth: DepthFn,
                 insert: Callable[..., Awaitable[InsertedJob]],
                 insert_many: Callable[..., Awaitable[list[InsertedJob]]],
                 enqueue_many: Callable[..., Awaitable[int]], *,
                 min_sleep: float = 0.01, max_sleep: float = 1.0,
                 max_wait: float | None = None) -> None:
        self.queue = check_name("queue", queue)
        self.target_depth = check_int("target_depth", target_depth, 1, states.DEPTH_LIMIT_MAX)
        if not 0 < check_seconds("min_sleep", min_sleep) <= check_seconds("max_sleep", max_sleep):
            raise ValidationError("min_sleep", "must be > 0 and <= max_sleep")
        self.max_wait = None if max_wait is None else check_seconds("max_wait", max_wait)
        self._min_sleep, self._max_sleep = min_sleep, max_sleep
        self._depth, self._insert = depth, insert
        self._insert_many, self._enqueue_many = insert_many, enqueue_many
        # Count past the target, so a falling depth shows while still above it.
        self._cap = min(2 * self.target_depth, states.DEPTH_LIMIT_MAX)
        self.inserted = 0
        self.paused_seconds = 0.0
        self.last_depth: QueueDepth | None = None

    async def wait_for_room(self) -> QueueDepth:
        """Return once the queue holds fewer than ``target_depth`` available jobs."""
        started = time.monotonic()
        sleep = self._min_sleep
        seen: tuple[float, int] | None = None
        while True:
            depth = self.last_depth = await self._depth(self.queue, self._cap)
            if depth.depth < self.target_depth:
                return depth
            now = time.monotonic()
            if self.max_wait is not None and now - started >= self.max_wait:
                raise QueueFull(self.queue, depth.depth, self.target_depth)
            if seen is not None and depth.depth < seen[1] and now > seen[0]:
                rate = (seen[1] - depth.depth) / (now - seen[0])  # jobs drained per second
                sleep = (depth.depth - self.target_depth + 1) / rate
            else:
                sleep = sleep * 2 if seen is not None else sleep
            sleep = min(max(sleep, self._min_sleep), self._max_sleep)
            seen = (now, depth.depth)
            await asyncio.sleep(sleep)
            self.paused_seconds += time.monotonic() - now

    async def insert(self, args: Any, **opts: Any) -> InsertedJob:
        """`AsyncClient.insert` into the paced queue, once there is room."""
        await self.wait_for_room()
        job = await self._insert(args, **self._own(opts))
        self.inserted += 1
        return job

    async def insert_many(self, jobs: Sequence[Any], **defaults: Any) -> list[InsertedJob]:
        """`AsyncClient.insert_many_copy` into the paced queue, once there is room."""
        await self.wait_for_room()
        inserted = await self._insert_many(jobs, **self._own(defaults))
        self.inserted += len(inserted)
        return inserted

    async def enqueue_many(self, jobs: Sequence[Any], **defaults: Any) -> int:
        """`AsyncClient.enqueue_many_copy` (binary COPY) into the paced queue."""
        await self.wait_for_room()
        n = await self._enqueue_many(jobs, **self._own(defaults))
        self.inserted += n
        return n

    def _own(self, opts: Mapping[str, Any]) -> dict[str, Any]:
        if opts.get("queue", self.queue) != self.queue:
            raise ValidationError("queue", f"this pacer inserts into queue {self.queue!r}")
        if "opts" in opts and any(o and "queue" in o for o in opts["opts"] or ()):
            raise ValidationError("opts", "a paced insert cannot route jobs to other queues")
        return {**opts, "queue": self.queue}

    async def __aenter__(self) -> Pacer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        return None
