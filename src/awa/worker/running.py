"""A claimed job's way to its written outcome, as calls.

`Dispatcher` claims and calls `JobRunner.launch` (one task per job) →
`JobRunner.run`: `JobExecutor.prepare` decodes the args and makes the
context, the `Attempts` table records the running handler, `JobExecutor.run`
runs it, its slot is released (`Capacity`), then `Finalizer.batched` queues a
plain completion for the `Completer`'s next batch, or `JobRunner.record`
finalizes any other outcome (`Finalizer.finalize`: follow-ups, callbacks,
the write under the run lease) and reports it (telemetry, the job log,
lifecycle hooks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping

from awa.core.model import Job, Outcome
from awa.telemetry import joblog
from awa.telemetry import otel as telemetry
from awa.worker.attempts import Attempts
from awa.worker.capacity import Capacity
from awa.worker.completion import Completer
from awa.worker.context import AttemptControl, JobContext
from awa.worker.dispatcher import Dispatcher
from awa.worker.executor import JobExecutor
from awa.worker.finalize import Finalizer
from awa.worker.followups import FollowUpRegistry

log = logging.getLogger("awa.runtime")


class JobRunner:
    """Runs claimed jobs to their outcome; owns their tasks until they are done."""

    def __init__(self, executor: JobExecutor, finalizer: Finalizer, completer: Completer,
                 followups: FollowUpRegistry, attempts: Attempts, capacity: Capacity,
                 dispatchers: Mapping[str, Dispatcher], *, weighted: bool) -> None:
        self._executor = executor
        self._finalizer = finalizer
        self._completer = completer
        self._followups = followups
        self._attempts = attempts
        self._capacity = capacity
        self._dispatchers = dispatchers
        self._weighted = weighted
        #: Outcomes written other than completions, by (outcome kind, queue): metrics.
        self.outcomes: Counter[tuple[str, str]] = Counter()
        #: Running job tasks by (job id, run lease): an attempt's task removes itself.
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}

    def launch(self, job: Job) -> None:
        """Start running a claimed job (the dispatcher's call)."""
        wait = None
        if job.attempted_at is not None:
            wait = (job.attempted_at - job.run_at_datetime).total_seconds()
            self._completer.observe_wait(job.queue, wait)
        telemetry.claimed(job, wait)
        # The loop's own create_task: asyncio.create_task adds a Python call and a
        # task-name step per job.
        self._tasks[(job.id, job.run_lease)] = \
            asyncio.get_running_loop().create_task(self.run(job))

    def reject(self, job_id: int, lease: int, error: str, slot: int | None = None) -> None:
        """Fail a claimed job that cannot even be decoded (see `Dispatcher`)."""
        async def fail() -> None:
            try:
                await self._completer.write(job_id, lease, Outcome("fail", error=error,
                                                                   terminal=True), slot=slot)
            finally:
                self._tasks.pop((job_id, lease), None)
        self._tasks[(job_id, lease)] = asyncio.create_task(fail())

    async def run(self, job: Job) -> None:
        """Run one job. The slot frees when the handler returns; the completion
        backlog is bounded separately (see `Dispatcher`). The task leaves
        ``_tasks`` itself: a done callback would cost the loop a turn per job."""
        try:
            ctx, outcome = self._executor.prepare(job)
            if ctx is not None:
                self._attempts.start(job, ctx)
                if self._followups.has_hooks:
                    self._followups.emit("started", job)
                started = time.perf_counter()
                try:
                    outcome = await self._executor.run(job, ctx)
                except asyncio.CancelledError:
                    # Shutdown abandoned the handler: the job stays running and is
                    # rescued once its heartbeat goes stale; staged follow-ups go with it.
                    AttemptControl(ctx).cancel()
                    self._attempts.pop(job.id)
                    self._release(job.queue)
                    raise
                self._dispatchers[job.queue].ran(time.perf_counter() - started)
            self._release(job.queue)
            assert outcome is not None
            if ctx is not None and self._finalizer.batched(job, ctx, outcome):
                telemetry.outcome(job, "completed")  # the common case, without a coroutine
            else:
                await self.record(job, ctx, outcome)
        finally:
            self._attempts.end(job)
            self._tasks.pop((job.id, job.run_lease), None)

    async def record(self, job: Job, ctx: JobContext | None, outcome: Outcome) -> None:
        """Write the outcome with its follow-ups; fire hooks once it has committed."""
        done = await self._finalizer.finalize(job, ctx, outcome, allow_batch=True)
        if not done.written:
            log.info("outcome of job %d not written (stale lease, or left for rescue)", job.id)
            return
        telemetry.outcome(job, done.outcome.kind)
        joblog.outcome(job, done.outcome.kind, done.outcome.error, done.outcome.terminal)
        if done.outcome.kind != "completed":
            self.outcomes[(done.outcome.kind, job.queue)] += 1
        if done.trigger is not None:
            self._followups.emit(done.trigger, job, done.outcome.error)

    def _release(self, queue: str) -> None:
        """A handler returned: free its slot and tell the dispatchers that can use it."""
        self._capacity.release(queue)
        if self._weighted:
            for d in self._dispatchers.values():
                d.slot_freed()
        else:
            self._dispatchers[queue].slot_freed()

    async def finish(self, timeout: float) -> None:
        """Shutdown: ask running handlers to stop, wait up to ``timeout`` s, then
        abandon the rest (their jobs stay running, for rescue)."""
        if not self._tasks:
            return
        # Handlers that poll job.is_cancelled() may wind down within the timeout.
        self._attempts.cancel_all()
        _, pending = await asyncio.wait(set(self._tasks.values()), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("abandoned %d running jobs at shutdown; rescue will retry them",
                        len(pending))
            await asyncio.gather(*pending, return_exceptions=True)
