"""The one table of what each attempt outcome is called and how it is written.

An `Outcome`'s ``kind`` (``"retry"``, ``"fail"``, ...) is named differently by
each reader: the statement that writes it, the follow-up trigger it fires
(``"retried"``, ``"exhausted"``), the name `awa.testing` reports
(``"retryable"``, ``"failed"``) and the telemetry name (``"retried"``,
``"failed"``). They are all here, once, and every reader looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from awa.core.model import OutcomeKind

#: What a follow-up spec or hook is registered for (``on_completed_enqueue``):
#: the triggers of `OUTCOMES`, plus ``"rescued"`` (the rescuer's, not a handler's).
Trigger = Literal["completed", "retried", "exhausted", "cancelled", "waiting_for_callback",
                  "rescued"]


@dataclass(frozen=True, slots=True)
class OutcomeSpec:
    """How one outcome kind is written, what it fires and what it is called."""

    #: The named statement (``db/sql/attempt.sql`` or ``callback.sql``) that writes
    #: it under the run lease; None: nothing to write.
    statement: str | None
    #: The follow-up trigger it fires once written; None: it fires none.
    trigger: Trigger | None
    #: What `awa.testing`'s ``WorkResult.outcome`` calls it (awa-pg's names: the
    #: job's state afterwards, but ``"snoozed"``); None: the harness cannot report it.
    state: str | None
    #: Its name in telemetry: the ``awa.job.outcome`` attribute, and for a
    #: ``counted`` one the ``awa.job.<name>`` counter and ``awa_job_<name>_total``.
    telemetry: str
    #: It has an ``awa.job.<telemetry>`` counter.
    counted: bool
    #: The attempt failed (retried or failed for good): its span's status is ERROR.
    failure: bool
    #: Worth a line in the ``awa.jobs`` log when written (`awa.telemetry.joblog`).
    logged: bool = False
    #: The HELP of its per-queue ``awa_job_<telemetry>_total`` on a worker's
    #: ``/metrics`` (`awa.worker.metrics`); None: not counted there.
    metric_help: str | None = None
    #: A handler's outcome of this kind may ride the batched completion
    #: (`Finalizer.finalize`, `Completer.complete`).
    batched: bool = False
    #: Counted in the queue's throughput figures once written (`Completer.count`).
    throughput: bool = False


#: Every `OutcomeKind`, exactly once (tests/test_outcomes.py checks it).
OUTCOMES: dict[OutcomeKind, OutcomeSpec] = {
    "completed": OutcomeSpec("attempt_complete_batch", "completed", "completed", "completed",
                             counted=True, failure=False, batched=True, throughput=True),
    "retry": OutcomeSpec("attempt_retry", "retried", "retryable", "retried",
                         counted=True, failure=True, logged=True,
                         metric_help="Failed attempts to be retried"),
    "snooze": OutcomeSpec("attempt_snooze", None, "snoozed", "snoozed",
                          counted=False, failure=False),
    "cancel": OutcomeSpec("attempt_cancel", "cancelled", "cancelled", "cancelled",
                          counted=True, failure=False, logged=True,
                          metric_help="Handlers that returned Cancel"),
    "fail": OutcomeSpec("attempt_fail", "exhausted", "failed", "failed",
                        counted=True, failure=True, logged=True,
                        metric_help="Jobs failed for good", throughput=True),
    "wait": OutcomeSpec("callback_park", "waiting_for_callback", "waiting_external",
                        "waiting_external", counted=False, failure=False),
    # A caller-owned completion whose run lease was stale: nothing to write or report.
    "lost": OutcomeSpec(None, None, None, "lost", counted=False, failure=False),
}
