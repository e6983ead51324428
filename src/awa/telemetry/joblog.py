"""Job outcomes that need an operator's attention, logged through ``awa.jobs``.

A retry is a WARNING, a failure for good an ERROR, a rescue (stale
heartbeat, hard deadline) or callback timeout a WARNING; a handler's cancel
is INFO. Each line names the job's id, kind, queue and attempt, which also
travel as ``extra`` fields (``job_id``, ``kind``, ``queue``, ``attempt``) for
structured handlers such as ``awa worker --log-format json``. Args and the
messages of handlers' exceptions are never logged (they may carry personal
data): only the exception's type. The whole error is in the job's ``errors``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from awa.core.model import Job

log = logging.getLogger("awa.jobs")


def _fields(job_id: int, kind: str, queue: str, attempt: int) -> dict[str, Any]:
    return {"job_id": job_id, "kind": kind, "queue": queue, "attempt": attempt}


def _error_type(error: str | None) -> str:
    """``"ValueError: secret"`` → ``"ValueError"``: the type, never the message."""
    head = (error or "").split(":", 1)[0].strip()
    return head if head.isidentifier() else "error"


def outcome(job: Job, kind: str, error: str | None, terminal: bool = False) -> None:
    """Log an attempt's written outcome if it needs attention (retry, fail, cancel)."""
    if kind not in ("retry", "fail", "cancel"):
        return
    where = (f"job {job.id} (kind={job.kind} queue={job.queue} "
             f"attempt={job.attempt}/{job.max_attempts})")
    extra = _fields(job.id, job.kind, job.queue, job.attempt)
    if kind == "retry":
        log.warning("%s raised %s; retrying", where, _error_type(error), extra=extra)
    elif kind == "cancel":
        log.info("%s cancelled by its handler", where, extra=extra)
    else:
        why = "TerminalError" if terminal else f"{_error_type(error)}, attempts used up"
        log.error("%s failed for good (%s)", where, why, extra=extra)


def rescued(row: Mapping[str, Any]) -> None:
    """Log one job the rescuer took back (heartbeat stale, deadline, callback timeout)."""
    reason = (row["reason"] or "rescued").split(" (", 1)[0]  # our own text, never user data
    then = "failed for good" if row["outcome"] == "failed" else "will retry"
    log.warning("job %d (kind=%s queue=%s attempt=%d) rescued: %s; %s", row["id"],
                row["kind"], row["queue"], row["attempt"], reason, then,
                extra=_fields(row["id"], row["kind"], row["queue"], row["attempt"]))
