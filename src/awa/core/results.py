"""`InsertedJob`: the `Job` an insert returns, which can also wait for its result.

It is a `Job` (same fields, ``isinstance(job, awa.Job)``, equal to a `Job`
with the same fields), so code written for awa-pg keeps working; it adds
``wait()`` (from an `AsyncClient`) or ``wait_sync()`` (from the sync
`Client`), and ``queue_depth`` when the insert measured its queue
(``backpressure="signal"`` or ``Reject``). The client that inserted the job
sets the waiter; nothing else here does I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

from awa.core.backpressure import QueueDepth
from awa.core.errors import AwaError
from awa.core.model import Job

#: ``waiter(job_id, timeout, poll_interval=...) -> finished job`` (a client's ``wait_for``).
AsyncWaiter = Callable[..., Awaitable[Job]]
SyncWaiter = Callable[..., Job]
_JOB_FIELDS = tuple(f.name for f in fields(Job))  # all, receipt_slot too: a copy


class InsertedJob(Job):
    """A just-inserted `Job` that can be waited on: ``await job.wait(timeout=30)``.

    The wait returns the finished job (``state`` completed, failed or
    cancelled; ``output`` what the handler returned with `awa.Output`) and
    raises `WaitTimeout` on timeout; see `AsyncClient.wait_for`.
    """

    __slots__ = ("_async_waiter", "_sync_waiter", "queue_depth")

    _async_waiter: AsyncWaiter | None
    _sync_waiter: SyncWaiter | None
    #: The queue's depth measured before this insert, when it asked for one.
    queue_depth: QueueDepth | None

    @classmethod
    def attach(cls, job: InsertedJob, *, async_waiter: AsyncWaiter | None = None,
               sync_waiter: SyncWaiter | None = None,
               depth: QueueDepth | None = None) -> InsertedJob:
        """Set how ``job`` waits (the inserting client's) and the depth it saw."""
        job._async_waiter = async_waiter
        job._sync_waiter = sync_waiter
        job.queue_depth = depth
        return job

    async def wait(self, timeout: float | None = None, *,
                   poll_interval: float | None = None) -> Job:
        """Wait until this job finishes; returns it (see `AsyncClient.wait_for`)."""
        waiter = getattr(self, "_async_waiter", None)
        if waiter is None:
            raise AwaError("this job was not inserted by an AsyncClient: use "
                           "job.wait_sync() (sync Client) or client.wait_for(job.id)")
        job: Job = await waiter(self.id, timeout, poll_interval=poll_interval)
        return job

    def wait_sync(self, timeout: float | None = None, *,
                  poll_interval: float | None = None) -> Job:
        """Block until this job finishes (jobs inserted by the sync `Client`)."""
        waiter = getattr(self, "_sync_waiter", None)
        if waiter is None:
            raise AwaError("this job was not inserted by the sync Client: use "
                           "await job.wait() or client.wait_for(job.id)")
        job: Job = waiter(self.id, timeout, poll_interval=poll_interval)
        return job

    def __eq__(self, other: object) -> bool:
        # The dataclass __eq__ wants the exact same class: compare as a Job.
        if not isinstance(other, Job):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _JOB_FIELDS)

    __hash__ = None  # type: ignore[assignment]  # as Job's (a mutable dataclass)

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickle or copy is a plain Job: the waiter (a live client) cannot travel.
        return Job, tuple(getattr(self, n) for n in _JOB_FIELDS)

    def __getattr__(self, name: str) -> Any:
        # Unset extra slots (a copy made by dataclasses.replace) read as None.
        if name in InsertedJob.__slots__:
            return None
        raise AttributeError(name)
