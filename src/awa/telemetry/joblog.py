"""Job outcomes that need an operator's attention, logged through ``awa.jobs``.

A retry is a WARNING, a failure for good an ERROR, a rescue (stale
heartbeat, hard deadline) or callback timeout a WARNING; a handler's cancel
is INFO. Each line names the job's id, kind, queue and attempt, which also
travel as ``extra`` fields (``job_id``, ``kind``, ``queue``, ``attempt``) for
structured handlers such as ``awa worker --log-format json``. Args are never
logged. A handler's exception is logged as its type and the first line of
its message, cut at `MESSAGE_MAX_CHARS`; where messages may carry data that
must not reach logs, `set_log_error_messages(False)` (or
``AWA_LOG_ERROR_MESSAGES=0``) logs the type only. Each line names
``awa job dump ID``, which shows the whole error and its traceback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from awa.core.errors import ValidationError
from awa.core.model import Job, OutcomeKind
from awa.core.outcomes import OUTCOMES

log = logging.getLogger("awa.jobs")

#: The longest exception message a log line carries (its first line, cut here).
MESSAGE_MAX_CHARS = 200

_messages: bool | None = None  # None: $AWA_LOG_ERROR_MESSAGES decides (default on)


def set_log_error_messages(enabled: bool | None) -> None:
    """Whether job log lines carry the first line of a handler's exception message
    (default True); False logs the exception's type only. None: back to the
    default, ``$AWA_LOG_ERROR_MESSAGES`` (``0`` turns messages off)."""
    global _messages
    if enabled is not None and not isinstance(enabled, bool):
        raise ValidationError("log_error_messages", "must be True, False or None")
    _messages = enabled


def log_error_messages() -> bool:
    """Whether job log lines carry exception messages (see `set_log_error_messages`)."""
    if _messages is not None:
        return _messages
    return os.environ.get("AWA_LOG_ERROR_MESSAGES", "1").strip().lower() not in (
        "0", "false", "no", "off")


def _fields(job_id: int, kind: str, queue: str, attempt: int) -> dict[str, Any]:
    return {"job_id": job_id, "kind": kind, "queue": queue, "attempt": attempt}


def _error_type(error: str | None) -> str:
    """``"ValueError: secret"`` → ``"ValueError"``: the type, never the message."""
    head = (error or "").split(":", 1)[0].strip()
    return head if head.isidentifier() else "error"


def _error_summary(error: str | None) -> str:
    """``"ValueError: bad id 7\n  File ..."`` → ``"ValueError: bad id 7"`` (first line,
    cut at `MESSAGE_MAX_CHARS`), or ``"ValueError"`` when messages stay out of logs."""
    kind = _error_type(error)
    if not log_error_messages() or kind == "error":
        return kind
    first = (error or "").split("\n", 1)[0].partition(":")[2].strip()
    if not first:
        return kind
    if len(first) > MESSAGE_MAX_CHARS:
        first = first[:MESSAGE_MAX_CHARS - 1] + "…"
    return f"{kind}: {first}"


def outcome(job: Job, kind: OutcomeKind, error: str | None, terminal: bool = False) -> None:
    """Log an attempt's written outcome if it needs attention (retry, fail, cancel)."""
    if not OUTCOMES[kind].logged:
        return
    where = (f"job {job.id} (kind={job.kind} queue={job.queue} "
             f"attempt={job.attempt}/{job.max_attempts})")
    extra = _fields(job.id, job.kind, job.queue, job.attempt)
    dump = f"awa job dump {job.id}"
    if kind == "retry":
        if error is None:  # the handler returned RetryAfter: asked for, not a failure
            log.info("%s asked to retry later (RetryAfter)", where, extra=extra)
        else:
            log.warning("%s raised %s; retrying (details: %s)", where,
                        _error_summary(error), dump, extra=extra)
    elif kind == "cancel":
        log.info("%s cancelled by its handler", where, extra=extra)
    else:
        if terminal:
            summary = _error_summary(error)
            why = summary if summary.startswith("TerminalError") else f"TerminalError, {summary}"
        else:
            why = f"{_error_summary(error)}, attempts used up"
        log.error("%s failed for good (%s; details: %s)", where, why, dump, extra=extra)


def rescued(row: Mapping[str, Any]) -> None:
    """Log one job the rescuer took back (heartbeat stale, deadline, callback timeout)."""
    reason = (row["reason"] or "rescued").split(" (", 1)[0]  # our own text, never user data
    then = "failed for good" if row["outcome"] == "failed" else "will retry"
    log.warning("job %d (kind=%s queue=%s attempt=%d) rescued: %s; %s", row["id"],
                row["kind"], row["queue"], row["attempt"], reason, then,
                extra=_fields(row["id"], row["kind"], row["queue"], row["attempt"]))
