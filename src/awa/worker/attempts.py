"""The attempts table: the handlers running in this process, by job id.

The runner adds an attempt when its handler starts and drops it when the
handler is done; the heartbeat reads it (with the leases), a lost lease or an
``awa_cancel`` cancels through it, an ``awa_callback`` wakes the waiting
handler through it, and health, metrics and presence count it per queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from awa.core.model import Job
from awa.worker.context import AttemptControl, JobContext


@dataclass(slots=True)
class Attempt:
    """One running handler: its run lease, its context and its queue."""

    lease: int
    ctx: JobContext
    queue: str


class Attempts:
    """Running handlers by job id (one attempt per job at a time)."""

    def __init__(self) -> None:
        self._by_id: dict[int, Attempt] = {}

    def start(self, job: Job, ctx: JobContext) -> None:
        """The handler of ``job``'s current attempt is running."""
        self._by_id[job.id] = Attempt(job.run_lease, ctx, job.queue)

    def end(self, job: Job) -> None:
        """That handler is done (a newer attempt of the same job stays)."""
        attempt = self._by_id.get(job.id)
        if attempt is not None and attempt.lease == job.run_lease:
            del self._by_id[job.id]

    def pop(self, job_id: int, default: Attempt | None = None) -> Attempt | None:
        """Forget ``job_id``'s attempt, whatever its lease."""
        return self._by_id.pop(job_id, default)

    def cancel(self, job_id: int) -> bool:
        """Flag ``job_id``'s running handler cancelled; False if none runs here."""
        attempt = self._by_id.get(job_id)
        if attempt is None:
            return False
        AttemptControl(attempt.ctx).cancel()
        return True

    def cancel_all(self) -> None:
        """Flag every running handler cancelled (shutdown: they may wind down)."""
        for attempt in self._by_id.values():
            AttemptControl(attempt.ctx).cancel()

    def notify(self, job_id: int) -> None:
        """Wake ``job_id``'s handler if it waits on a callback here."""
        attempt = self._by_id.get(job_id)
        if attempt is not None:
            AttemptControl(attempt.ctx).notify()

    def leases(self) -> list[tuple[int, int, JobContext, int | None]]:
        """(job id, run lease, context, receipt slot) of every running handler (for
        the heartbeat)."""
        return [(job_id, a.lease, a.ctx, AttemptControl(a.ctx).receipt_slot)
                for job_id, a in self._by_id.items()]

    def per_queue(self) -> Counter[str]:
        """Running handlers per queue."""
        return Counter(a.queue for a in self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_id

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)
