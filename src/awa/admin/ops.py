"""The admin half of `AsyncClient`: inspection, admin actions, callbacks, DLQ, cron.

Each method is written once here (async) and delegated by the sync `awa.Client`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg

from awa.admin import dlq
from awa.admin import jobs as admin
from awa.admin.dlq import DlqEntry
from awa.admin.workflows import WorkflowGraph, workflow_graph
from awa.core import states, validate
from awa.core.errors import ValidationError
from awa.core.model import Job, KeyStat, QueueStat, ResolveResult, RetryFailedResult
from awa.core.states import JobState
from awa.db.errors import translated
from awa.db.queries import Queries
from awa.maintenance import cron
from awa.worker import callbacks
from awa.worker.followups import FollowUpRegistry


class AdminOps:
    """Mixed into `AsyncClient`; needs ``pool()``, ``_q`` and ``_followups``."""

    _q: Queries
    _followups: FollowUpRegistry
    retention_cancelled: timedelta

    async def pool(self) -> asyncpg.Pool:
        raise NotImplementedError

    # -- inspection and admin --------------------------------------------------

    async def get_job(self, job_id: int) -> Job:
        """The job with this id (active, finished or dead-lettered)."""
        return await admin.get_job(await self.pool(), self._q, job_id)

    async def workflow(self, job_id: int) -> WorkflowGraph:
        """The jobs connected to ``job_id`` by dependencies, with their states and edges."""
        return await workflow_graph(await self.pool(), self._q, job_id)

    async def list_jobs(self, *, state: JobState | str | None = None, kind: str | None = None,
                        queue: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs newest first, optionally filtered."""
        return await admin.list_jobs(await self.pool(), self._q, state=state, kind=kind,
                                     queue=queue, limit=limit)

    async def dump_job(self, job_id: int) -> str:
        """Every field of a job as JSON."""
        return await admin.dump_job(await self.pool(), self._q, job_id)

    async def cancel(self, job_id: int) -> Job | None:
        """Cancel an unfinished job; None if it had already finished."""
        return await admin.cancel(await self.pool(), self._q, job_id,
                                  retention=self.retention_cancelled)

    async def cancel_by_unique_key(self, kind: str, *, queue: str | None = None,
                                   args: Any = None,
                                   period_bucket: int | None = None) -> Job | None:
        """Cancel the unfinished job holding this unique key, if any."""
        return await admin.cancel_by_unique_key(
            await self.pool(), self._q, kind, queue=queue, args=args,
            period_bucket=period_bucket, retention=self.retention_cancelled)

    async def retry(self, job_id: int) -> Job:
        """Send a failed, cancelled or waiting job back to available (attempt 0)."""
        return await admin.retry(await self.pool(), self._q, job_id)

    async def pause_queue(self, queue: str, paused_by: str | None = None) -> None:
        """Stop workers claiming from ``queue``."""
        await admin.pause_queue(await self.pool(), self._q, queue, paused_by)

    async def resume_queue(self, queue: str) -> None:
        """Let workers claim from ``queue`` again."""
        await admin.resume_queue(await self.pool(), self._q, queue)

    async def drain_queue(self, queue: str) -> int:
        """Cancel all jobs of ``queue`` waiting to run or waiting on a callback."""
        return await admin.drain_queue(await self.pool(), self._q, queue,
                                       retention=self.retention_cancelled)

    # -- external callbacks -------------------------------------------------------------

    def _callback_resolver(self) -> callbacks.Resolver:
        """This client's follow-ups, hooks and retentions, for resolving callbacks."""
        return callbacks.Resolver(self._followups, states.COMPLETED_RETENTION,
                                  self.retention_cancelled)

    async def _resolve(self, action: callbacks.Action, callback_id: str, arg: Any) -> Job:
        return await callbacks.resolve(await self.pool(), self._q, action, callback_id, arg,
                                       self._callback_resolver())

    async def complete_external(self, callback_id: str, payload: Any = None) -> Job:
        """Complete the job waiting on ``callback_id``."""
        return await self._resolve("complete", callback_id, payload)

    async def fail_external(self, callback_id: str, error: str) -> Job:
        """Fail the job waiting on ``callback_id``."""
        return await self._resolve("fail", callback_id, error)

    async def retry_external(self, callback_id: str) -> Job:
        """Send the job waiting on ``callback_id`` back to available."""
        return await self._resolve("retry", callback_id, None)

    async def resume_external(self, callback_id: str, payload: Any = None) -> Job:
        """Hand ``payload`` to the handler waiting on ``callback_id``; it carries on."""
        return await self._resolve("resume", callback_id, payload)

    async def resolve_callback(self, callback_id: str, payload: Any = None,
                               default_action: str = "ignore") -> ResolveResult:
        """Complete, fail or ignore by the callback's CEL rules (`awa.core.callback_rules`)."""
        return await callbacks.resolve_callback(await self.pool(), self._q, callback_id,
                                                payload, default_action,
                                                resolver=self._callback_resolver())

    async def heartbeat_callback(self, callback_id: str,
                                 timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS) -> Job:
        """Push a waiting callback's timeout to ``timeout_seconds`` from now."""
        return await self._resolve("heartbeat", callback_id, timeout_seconds)

    async def queue_stats(self) -> list[QueueStat]:
        """Per-queue counts, lag and pause state."""
        return await admin.queue_stats(await self.pool(), self._q)

    async def concurrency_keys(self, queue: str | None = None,
                               limit: int = states.KEY_STATS_LIMIT_DEFAULT) -> list[KeyStat]:
        """Concurrency keys with jobs in flight (one queue, or all), saturated first:
        jobs in flight, limit and jobs waiting per key, at most ``limit`` keys."""
        return await admin.concurrency_keys(await self.pool(), self._q, queue, limit)


    async def retry_failed(self, *, kind: str | None = None,
                           queue: str | None = None) -> RetryFailedResult:
        """Send every failed job of one kind, or of one queue, back to available."""
        return await admin.retry_failed(await self.pool(), self._q, kind=kind, queue=queue)

    async def discard_failed(self, kind: str) -> int:
        """Delete the failed jobs of ``kind``; returns how many."""
        return await admin.discard_failed(await self.pool(), self._q, kind)

    async def dump_run(self, job_id: int, attempt: int | None = None) -> str:
        """One attempt of a job (default: the latest), reconstructed as JSON."""
        return await admin.dump_run(await self.pool(), self._q, job_id, attempt)

    # -- dead letter queue ----------------------------------------------------------------

    async def list_dlq(self, *, kind: str | None = None, queue: str | None = None,
                       tag: str | None = None, before_id: int | None = None,
                       before_dlq_at: datetime | None = None,
                       limit: int = 100) -> list[DlqEntry]:
        """Dead-lettered jobs, newest first (page with ``before_id``)."""
        return await dlq.list_dlq(await self.pool(), self._q, kind=kind, queue=queue, tag=tag,
                                  before_id=before_id, before_dlq_at=before_dlq_at,
                                  limit=limit)

    async def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """One dead-lettered job, or None."""
        return await dlq.get_dlq_job(await self.pool(), self._q, job_id)

    async def dlq_depth(self, *, queue: str | None = None) -> int:
        """How many jobs are dead-lettered (in ``queue``, or in all)."""
        return await dlq.dlq_depth(await self.pool(), self._q, queue=queue)

    async def dlq_depth_by_queue(self) -> dict[str, int]:
        """Dead-lettered jobs per queue."""
        return await dlq.dlq_depth_by_queue(await self.pool(), self._q)

    async def retry_from_dlq(self, job_id: int, *, run_at: datetime | None = None,
                             priority: int | None = None,
                             queue: str | None = None) -> Job | None:
        """Re-enqueue a dead-lettered job (attempt 0), optionally elsewhere or later."""
        return await dlq.retry_from_dlq(await self.pool(), self._q, job_id, run_at=run_at,
                                        priority=priority, queue=queue)

    async def bulk_retry_from_dlq(self, *, kind: str | None = None, queue: str | None = None,
                                  tag: str | None = None, allow_all: bool = False) -> int:
        """Re-enqueue every matching dead-lettered job."""
        return await dlq.bulk_retry_from_dlq(await self.pool(), self._q, kind=kind,
                                             queue=queue, tag=tag, allow_all=allow_all)

    async def move_failed_to_dlq(self, job_id: int, reason: str = "manual") -> DlqEntry | None:
        """Move a failed job into the DLQ."""
        return await dlq.move_failed_to_dlq(await self.pool(), self._q, job_id, reason)

    async def bulk_move_failed_to_dlq(self, *, kind: str | None = None,
                                      queue: str | None = None, tag: str | None = None,
                                      reason: str = "manual", allow_all: bool = False) -> int:
        """Move every matching failed job into the DLQ."""
        return await dlq.bulk_move_failed_to_dlq(await self.pool(), self._q, kind=kind,
                                                 queue=queue, tag=tag, reason=reason,
                                                 allow_all=allow_all)

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete one dead-lettered job."""
        return await dlq.purge_dlq_job(await self.pool(), self._q, job_id)

    async def purge_dlq(self, *, kind: str | None = None, queue: str | None = None,
                        tag: str | None = None, before_id: int | None = None,
                        before_dlq_at: datetime | None = None, allow_all: bool = False) -> int:
        """Delete every matching dead-lettered job."""
        return await dlq.purge_dlq(await self.pool(), self._q, kind=kind, queue=queue, tag=tag,
                                   before_id=before_id, before_dlq_at=before_dlq_at,
                                   allow_all=allow_all)

    # -- cron -------------------------------------------------------------------------

    async def list_cron_jobs(self) -> list[dict[str, Any]]:
        """Every schedule in the database, with its next fire time."""
        pool = await self.pool()
        with translated():
            rows = await pool.fetch(self._q["cron_list"])
        return [cron.describe(r) for r in rows]

    async def delete_cron_job(self, name: str) -> bool:
        """Remove a schedule; False if there was none."""
        validate.check_name("name", name)
        pool = await self.pool()
        with translated():
            status = await pool.execute(self._q["cron_delete"], name)
        return status.endswith(" 1")

    async def pause_cron_job(self, name: str) -> bool:
        """Stop firing a schedule (False if unknown)."""
        validate.check_name("name", name)
        pool = await self.pool()
        with translated():
            return await pool.fetchrow(self._q["cron_set_paused"], name, True) is not None

    async def resume_cron_job(self, name: str) -> bool:
        """Fire a paused schedule again, from its next fire time after now."""
        validate.check_name("name", name)
        pool = await self.pool()
        with translated():
            return await pool.fetchrow(self._q["cron_set_paused"], name, False) is not None

    async def trigger_cron_job(self, name: str) -> Job:
        """Enqueue a schedule's job now, outside its timetable."""
        validate.check_name("name", name)
        with translated():
            job = await cron.trigger_now(await self.pool(), self._q, name)
        if job is None:
            raise ValidationError("name", f"no cron schedule named {name!r}")
        return job
