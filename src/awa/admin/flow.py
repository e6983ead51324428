"""The results-and-backpressure half of `AsyncClient`: ``wait_for``, queue depth.

Mixed into `AsyncClient` (the sync `awa.Client` delegates to it). The
enqueue methods themselves (``insert(..., backpressure=...)``) stay on the
client; this mixin holds what they record and what a producer reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

import asyncpg

from awa.admin.results import ResultWaiter
from awa.core import states
from awa.core.backpressure import QueueDepth
from awa.core.errors import AwaError
from awa.core.model import Job
from awa.core.validate import check_int, check_name
from awa.db.queries import Queries
from awa.enqueue import backpressure


class FlowOps:
    """Mixed into `AsyncClient`; needs ``pool()``, ``database_url()`` and ``_q``."""

    _q: Queries
    _results: ResultWaiter | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _depths: dict[str, QueueDepth] | None = None

    async def pool(self) -> asyncpg.Pool:
        raise NotImplementedError

    async def database_url(self) -> str:
        raise NotImplementedError

    async def wait_for(self, job_id: int, timeout: float | None = None, *,
                       poll_interval: float | None = None) -> Job:
        """Wait until the job finishes; returns it with its final ``state``
        (completed, failed, cancelled; a dead-lettered job is failed) and
        ``output``. `WaitTimeout` (a `TimeoutError`) after ``timeout`` seconds,
        leaving the job alone; `JobNotFound` for an unknown (or pruned) id.

        Woken by NOTIFY when LISTEN works (one extra connection per client,
        opened on first use), else by polling every ``poll_interval`` seconds
        (default 0.5 s; 5 s as a safety net while LISTEN works)."""
        if self._results is None:
            self._results = ResultWaiter(await self.pool(), self._q, await self.database_url())
        return await self._results.wait_for(job_id, timeout, poll_interval)

    def wait_for_sync(self, job_id: int, timeout: float | None = None, *,
                      poll_interval: float | None = None) -> Job:
        """`wait_for` from a thread other than the client's event loop (a plain
        ``def`` handler, a thread pool): blocks that thread until the job ends.
        On the loop's own thread it would deadlock, so it raises instead."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise AwaError("wait_for_sync needs this client open on a running event loop; "
                           "without one, use the sync awa.Client's wait_for")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise AwaError("wait_for_sync would block the client's own event loop: "
                           "use await client.wait_for(...) there")
        future = asyncio.run_coroutine_threadsafe(
            self.wait_for(job_id, timeout, poll_interval=poll_interval), loop)
        return future.result()

    async def queue_depth(self, queue: str, *, cap: int = states.DEPTH_SIGNAL_CAP) -> QueueDepth:
        """Available jobs of ``queue``, counted up to ``cap`` on the claim index
        (a depth equal to ``cap`` means at least that many)."""
        check_name("queue", queue)
        check_int("cap", cap, 1, states.DEPTH_LIMIT_MAX)
        async with (await self.pool()).acquire() as conn:
            return self._record_depths({queue: await backpressure.measure(conn, self._q,
                                                                          queue, cap)})[queue]

    @property
    def queue_depths(self) -> Mapping[str, QueueDepth]:
        """The depth last measured per queue by this client's ``backpressure="signal"``
        / ``Reject`` enqueues and `queue_depth` calls (read-only)."""
        return MappingProxyType(self._depths if self._depths is not None else {})

    def _record_depths(self, depths: dict[str, QueueDepth]) -> dict[str, QueueDepth]:
        if depths:
            if self._depths is None:
                self._depths = {}
            self._depths.update(depths)
        return depths

    async def _close_flow(self) -> None:
        results, self._results = self._results, None
        if results is not None:
            await results.close()
