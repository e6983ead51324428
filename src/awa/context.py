"""The ``job`` object a handler receives: the job's fields plus its controls.

Sits between the executor and the handler. Cancellation is a flag that
admin cancel, rescue, deadline or shutdown set and handlers poll.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from awa.model import Job
from awa.states import JobState


class JobContext:
    """A running attempt as the handler sees it (spec §3.4)."""

    def __init__(self, job: Job, args: Any) -> None:
        self._job = job
        self._args = args
        self._cancelled = False  # set from the loop; read from any thread

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
    def run_at(self) -> datetime:
        return self._job.run_at

    @property
    def deadline(self) -> datetime | None:
        return self._job.deadline

    @property
    def created_at(self) -> datetime:
        return self._job.created_at

    @property
    def progress(self) -> dict[str, Any] | None:
        return self._job.progress

    @property
    def traceparent(self) -> str | None:
        return self._job.traceparent

    @property
    def run_lease(self) -> int:
        return self._job.run_lease

    # -- controls -----------------------------------------------------------------
    def is_cancelled(self) -> bool:
        """True once the attempt should stop: cancel, rescue, deadline or shutdown."""
        return self._cancelled

    def _cancel(self) -> None:
        self._cancelled = True

    def __repr__(self) -> str:
        return (f"<JobContext id={self.id} kind={self.kind!r} queue={self.queue!r} "
                f"attempt={self.attempt}/{self.max_attempts}>")
