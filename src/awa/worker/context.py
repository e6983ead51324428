"""The ``job`` object a handler receives: the job's fields plus its controls.

Sits between the executor and the handler. Cancellation is a flag that admin
cancel, rescue, deadline or shutdown set and handlers poll. Progress is
buffered here and written with heartbeats, with the outcome, or on flush;
callbacks are registered and waited on here, in the running handler. Every write is guarded
by the attempt's run lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Unpack

import asyncpg

from awa.core import serialize, states
from awa.core.callback_rules import compile_rules
from awa.core.errors import AwaError, CallbackNotFound, ValidationError
from awa.core.model import CallbackToken, Job
from awa.core.options import InsertOptions
from awa.core.states import JobState
from awa.core.validate import check_timeout
from awa.core.waiting import wait_event
from awa.db.errors import translated
from awa.db.queries import Queries
from awa.enqueue import dependencies
from awa.enqueue.dependencies import ParentResult
from awa.enqueue.producer import Router
from awa.enqueue.transaction import Transaction
from awa.worker.followups import StagingBuffer

log = logging.getLogger("awa.context")


class CallbackWaitAborted(AwaError):
    """The job left an in-handler wait some other way (completed, failed, cancelled...)."""


@dataclass(frozen=True, slots=True)
class AttemptDb:
    """What a context needs to write under its run lease."""

    pool: asyncpg.Pool
    q: Queries
    poll_interval: float
    completed_retention: timedelta = states.COMPLETED_RETENTION  #: caller-owned completions
    #: The runtime's own pool (statement timeout) for the context's writes; else ``pool``.
    control: asyncpg.Pool | None = None

    @property
    def ops(self) -> asyncpg.Pool:
        """Where progress, callback and wait statements run."""
        return self.control if self.control is not None else self.pool


class JobContext:
    """A running attempt as the handler sees it: the job, its args, and what it may do.

    The worker's side of it (cancel, wake, seal, progress hand-over, the open
    transaction of a caller-owned completion) is `AttemptControl`, never these
    underscore names."""

    def __init__(self, job: Job, args: Any, db: AttemptDb | None = None,
                 router: Router | None = None) -> None:
        self._job = job
        self._args = args
        self._db = db
        self._cancelled = False  # set from the loop; read from any thread
        self._active = True
        self._progress: dict[str, Any] | None = (
            json.loads(json.dumps(job.progress)) if job.progress is not None else None)
        self._progress_dirty = False
        self._callback_id: str | None = None
        self._wake: asyncio.Event | None = None
        self._router = router
        self._staging: StagingBuffer | None = None  # made on first use: most jobs stage nothing
        self._transaction: Transaction | None = None
        self.output_json: str | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._flushes: set[asyncio.Future[None]] | None = None

    # -- read-only fields ---------------------------------------------------------
    @property
    def id(self) -> int:
        return self._job.id

    @property
    def kind(self) -> str:
        return self._job.kind

    @property
    def queue(self) -> str:
        return self._job.queue

    @property
    def state(self) -> JobState:
        return self._job.state

    @property
    def priority(self) -> int:
        return self._job.priority

    @property
    def attempt(self) -> int:
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        return self._job.max_attempts

    @property
    def tags(self) -> list[str]:
        return list(self._job.tags)

    @property
    def args(self) -> Any:
        """The args, rebuilt as the registered type."""
        return self._args

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._job.metadata)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self._job.errors)

    @property
    def run_at(self) -> str:
        """RFC 3339, as `Job.run_at`."""
        return self._job.run_at

    @property
    def deadline(self) -> str | None:
        """This attempt's hard deadline, RFC 3339 (None: no deadline)."""
        return self._job.deadline

    @property
    def created_at(self) -> str:
        """RFC 3339, as `Job.created_at`."""
        return self._job.created_at

    @property
    def run_at_datetime(self) -> datetime:
        return self._job.run_at_datetime

    @property
    def deadline_datetime(self) -> datetime | None:
        return self._job.deadline_datetime

    @property
    def created_at_datetime(self) -> datetime:
        return self._job.created_at_datetime

    @property
    def progress(self) -> dict[str, Any] | None:
        """The current progress: this attempt's buffer, else the last checkpoint."""
        return None if self._progress is None else dict(self._progress)

    @property
    def traceparent(self) -> str | None:
        return self._job.traceparent

    @property
    def run_lease(self) -> int:
        return self._job.run_lease

    @property
    def concurrency_key(self) -> str | None:
        """The job's concurrency key (docs/guide/concurrency-keys.md), or None."""
        return self._job.concurrency_key

    @property
    def concurrency_slot(self) -> int | None:
        """The slot of its key this attempt runs in (1..max_in_flight), or None."""
        return self._job.concurrency_slot

    # -- controls -----------------------------------------------------------------
    def is_cancelled(self) -> bool:
        """True once the attempt should stop: cancel, rescue, deadline or shutdown."""
        return self._cancelled

    def _cancel(self) -> None:
        self._cancelled = True
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    @property
    def staging(self) -> StagingBuffer:
        """This attempt's staged follow-ups (sealed once the handler returned)."""
        if self._staging is None:
            self._staging = StagingBuffer(self._router)
            self._staging.sealed = not self._active
        return self._staging

    def _staged_nothing(self) -> bool:
        """Nothing staged and no failed stage: the attempt needs no follow-up write."""
        st = self._staging
        return st is None or (not st.requests and st.poison is None)

    def _seal(self) -> None:
        self._active = False
        if self._staging is not None:
            self._staging.sealed = True

    # -- follow-ups and output -----------------------------------------------------

    @property
    def transaction(self) -> Transaction:
        """The open transaction of a ``completion="caller"`` handler (see `awa.owned`)."""
        if self._transaction is None:
            raise AwaError("job.transaction exists only in handlers registered with "
                           "completion='caller', while they run")
        return self._transaction

    def enqueue_on_completion(self, args: Any, **opts: Unpack[InsertOptions]) -> None:
        """Stage a follow-up, inserted only if this attempt's completion commits."""
        self.staging.stage(args, dict(opts))

    def set_output(self, value: Any) -> None:
        """Retain ``value`` (at most 64 KiB of JSON) on the completed job for inspection."""
        self._require_active("set_output")
        text = serialize.dumps(value, "output")
        if len(text.encode()) > states.OUTPUT_MAX_BYTES:
            raise ValidationError("output", f"at most {states.OUTPUT_MAX_BYTES} bytes of JSON")
        self.output_json = text

    async def parent_outputs(self) -> list[ParentResult]:
        """The jobs this one waited for (``after=``, a chain or a chord), in order,
        with how they finished and their retained outputs."""
        db = self._require_active("parent_outputs")
        async with db.ops.acquire() as conn:
            return await dependencies.parent_outputs(conn, db.q, self._job.id)

    def _require_active(self, what: str) -> AttemptDb:
        if not self._active or self._db is None:
            raise RuntimeError(f"{what} is only available while the attempt is running")
        return self._db

    # -- progress -----------------------------------------------------------------

    def set_progress(self, percent: float, message: str | None = None) -> None:
        """Record progress (clamped to 0-100); written with the next heartbeat."""
        self._require_active("set_progress")
        if isinstance(percent, bool) or not isinstance(percent, int | float) \
                or not math.isfinite(percent):
            raise ValidationError("percent", "must be a finite number")
        if message is not None and not isinstance(message, str):
            raise ValidationError("message", "must be a string")
        current = self._progress or {"metadata": {}}
        self._progress = {"percent": min(100.0, max(0.0, float(percent))), "message": message,
                          "metadata": current.get("metadata") or {}}
        self._progress_dirty = True

    def update_metadata(self, values: dict[str, Any]) -> None:
        """Shallow-merge ``values`` into the progress metadata (a resumable checkpoint)."""
        self._require_active("update_metadata")
        if not isinstance(values, dict):
            raise ValidationError("metadata", "must be a dict")
        serialize.dumps(values, "metadata")
        current = self._progress or {"percent": 0.0, "message": None, "metadata": {}}
        self._progress = {**current, "metadata": {**(current.get("metadata") or {}), **values}}
        self._progress_dirty = True

    def _take_progress(self) -> str | None:
        """The buffered progress as JSON if it changed since the last write."""
        if not self._progress_dirty:
            return None
        self._progress_dirty = False
        return serialize.dumps(self._progress, "progress", sized=False)

    def _restore_progress(self) -> None:
        self._progress_dirty = True

    async def _to_mutable_lane(self, db: AttemptDb) -> None:
        """Move a ring attempt to the mutable lane (docs/storage.md), where its
        progress and callbacks can be written; nothing for one already there."""
        slot = self._job.receipt_slot
        if slot is not None:
            with translated():
                await db.ops.execute(db.q["attempt_materialize"], [slot], [self.id],
                                     [self.run_lease])
            self._job.receipt_slot = None

    async def flush_progress(self) -> None:
        """Write buffered progress now."""
        db = self._require_active("flush_progress")
        text = self._take_progress()
        if text is None:
            return
        await self._to_mutable_lane(db)
        with translated():
            row = await db.ops.fetchrow(db.q["attempt_progress"], self.id, self.run_lease,
                                         text)
        if row is None:
            raise CallbackWaitAborted(f"job {self.id} is no longer owned by this attempt")

    def flush_progress_sync(self) -> None:
        """`flush_progress` for sync code: from a worker thread (a plain ``def``
        handler) it writes and waits; on the event loop's own thread it cannot
        block, so the write is scheduled there and happens moments later."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("flush_progress_sync needs the attempt's event loop")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = loop.create_task(self.flush_progress())
            if self._flushes is None:
                self._flushes = set()
            self._flushes.add(task)
            task.add_done_callback(self._flush_done)
            return
        asyncio.run_coroutine_threadsafe(self.flush_progress(), loop).result()

    def _flush_done(self, task: asyncio.Future[None]) -> None:
        if self._flushes is not None:
            self._flushes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a scheduled progress flush of job %d failed", self.id,
                        exc_info=task.exception())

    # -- callbacks ----------------------------------------------------------------

    async def register_callback(self, timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS, *,
                                filter: str | None = None, on_complete: str | None = None,
                                on_fail: str | None = None,
                                transform: str | None = None) -> CallbackToken:
        """Register an external callback on this attempt; supersedes any earlier one.
        CEL expressions over ``payload`` (validated now) drive `resolve_callback`."""
        db = self._require_active("register_callback")
        seconds = check_timeout(timeout_seconds)
        rules = compile_rules(filter=filter, on_complete=on_complete, on_fail=on_fail,
                              transform=transform)
        token = CallbackToken.new()
        await self._to_mutable_lane(db)
        with translated():
            row = await db.ops.fetchrow(db.q["callback_register"], self.id, self.run_lease,
                                         uuid.UUID(token.id), seconds,
                                         json.dumps(rules) if rules else None)
        if row is None:
            raise CallbackWaitAborted(f"job {self.id} is no longer owned by this attempt")
        self._callback_id = token.id
        return token

    async def wait_for_callback(self, token: CallbackToken) -> Any:
        """Park until ``resume_external`` resumes this callback; returns its payload."""
        db = self._require_active("wait_for_callback")
        if not isinstance(token, CallbackToken) or token.id != self._callback_id:
            raise CallbackNotFound("only the latest callback registered by this attempt "
                                   "can be waited on")
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.clear()
        progress = self._take_progress()
        cid = uuid.UUID(token.id)
        with translated():
            await db.ops.fetchrow(db.q["callback_wait"], self.id, self.run_lease, cid, progress)
        while True:
            with translated():
                st = await db.ops.fetchrow(db.q["callback_wait_status"], self.id)
            if st is None or st["run_lease"] != self.run_lease:
                raise CallbackWaitAborted(f"job {self.id} left the wait (finished or taken over)")
            if st["state"] == "running":
                if st["resumed"] == token.id:
                    self._callback_id = None
                    return st["result"]
                with translated():  # not parked yet: park now
                    parked = await db.ops.fetchrow(db.q["callback_wait"], self.id,
                                                    self.run_lease, cid, None)
                if parked is None:
                    raise CallbackWaitAborted(f"job {self.id} left the wait")
                continue
            if st["state"] != "waiting_external" or self._cancelled:
                raise CallbackWaitAborted(f"job {self.id} left the wait ({st['state']})")
            await wait_event(self._wake, db.poll_interval)
            self._wake.clear()

    def __repr__(self) -> str:
        return (f"<JobContext id={self.id} kind={self.kind!r} queue={self.queue!r} "
                f"attempt={self.attempt}/{self.max_attempts}>")


class AttemptControl:
    """The worker's interface to a running `JobContext`, which the handler never sees:
    the executor seals it, the finalizer reads what it staged and its callback,
    the heartbeat takes its progress, the runtime cancels and wakes it, and a
    caller-owned completion (`awa.worker.owned`) lends it its transaction.
    A view: make one wherever needed (it holds only the context)."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def cancel(self) -> None:
        """Flag the attempt cancelled (the handler polls it) and wake any wait."""
        self.ctx._cancel()

    def notify(self) -> None:
        """Wake a handler waiting on its callback (``NOTIFY awa_callback``)."""
        self.ctx._notify()

    def seal(self) -> None:
        """The handler returned: no more writes, staging or output from it."""
        self.ctx._seal()

    def staged_nothing(self) -> bool:
        """Nothing staged and no failed stage: no follow-up to write."""
        return self.ctx._staged_nothing()

    def take_progress(self) -> str | None:
        """Buffered progress as JSON if it changed since the last write (then clean)."""
        return self.ctx._take_progress()

    @property
    def receipt_slot(self) -> int | None:
        """The attempt's receipt slot while it is in the ring (`Job.receipt_slot`)."""
        return self.ctx._job.receipt_slot

    def moved(self) -> None:
        """The attempt was moved to the mutable lane (its progress goes there)."""
        self.ctx._job.receipt_slot = None

    def restore_progress(self) -> None:
        """The progress taken was not written: write it next time."""
        self.ctx._restore_progress()

    @property
    def callback_id(self) -> str | None:
        """The newest callback this attempt registered, if any."""
        return self.ctx._callback_id

    @property
    def db(self) -> AttemptDb | None:
        """Where the attempt writes (None for a context without a database)."""
        return self.ctx._db

    def lend_transaction(self, tx: Transaction | None) -> None:
        """Make ``tx`` the handler's ``job.transaction`` (None: take it back)."""
        self.ctx._transaction = tx
