"""Finalize: apply the completion rules to an attempt's outcome, then write it.

Shared by the runtime and the testing harness, so both follow the same rules:
a failed stage poisons a normal return (it fails terminally), a retained output rides on
the completion, a `WaitForCallback` needs this attempt's callback, staged
follow-ups ride only on the handler's own completion (discarded, with a
warning, on a `WaitForCallback` return), registered specs for the outcome's
trigger run first. A completion with no follow-ups may take the batched path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from awa.core.model import Job, Outcome
from awa.core.outcomes import OUTCOMES, Trigger
from awa.enqueue.producer import PreparedJob
from awa.worker.completion import Completer
from awa.worker.context import AttemptControl, JobContext
from awa.worker.executor import describe_error
from awa.worker.followups import FollowUpRegistry, OutcomeContext

log = logging.getLogger("awa.runtime")


@dataclass(slots=True)
class Finalized:
    """What finalizing did."""

    outcome: Outcome  #: the outcome actually written (after poisoning and checks)
    written: bool  #: committed, or (batched, nobody waiting) handed to the completer
    trigger: Trigger | None


class Finalizer:
    """Turns a handler's outcome into the write the rules call for."""

    def __init__(self, completer: Completer, followups: FollowUpRegistry) -> None:
        self.completer = completer
        self.followups = followups
        self.staged_discarded_on_wait = 0

    def resolve(self, job: Job, ctx: JobContext | None,
                outcome: Outcome) -> tuple[Outcome, list[PreparedJob]]:
        """The outcome to write and the follow-ups to insert with it."""
        staged = ctx.staging.seal() if ctx is not None else []
        if ctx is not None and outcome.kind == "completed":
            if ctx.staging.poison is not None:  # a failed stage poisons the attempt
                outcome = Outcome("fail", error=describe_error(ctx.staging.poison),
                                  terminal=True)
            elif outcome.output_json is None and ctx.output_json is not None:
                outcome = Outcome("completed", output_json=ctx.output_json)
        if outcome.kind == "wait" and (
                ctx is None or outcome.token != AttemptControl(ctx).callback_id):
            outcome = Outcome("fail", error="WaitForCallback returned without a callback "
                              "registered in this attempt", terminal=True)
        if staged and outcome.kind == "wait":
            self.staged_discarded_on_wait += len(staged)
            log.warning("job %d (%s) returned WaitForCallback with %d staged follow-ups; "
                        "they are discarded", job.id, job.kind, len(staged))
        trigger = OUTCOMES[outcome.kind].trigger
        followups: list[PreparedJob] = []
        if trigger is not None and self.followups.has_specs(trigger, job.kind):
            followups = self.followups.build(trigger, job, OutcomeContext(trigger, outcome.error))
        if outcome.kind == "completed":
            followups += staged
        return outcome, followups

    def batched(self, job: Job, ctx: JobContext, outcome: Outcome) -> bool:
        """The common case without a coroutine: a plain completion (nothing staged,
        no follow-up specs, no hooks) queued for the next batch; what `finalize`
        does for it, nothing waiting. False: not that case, nothing done."""
        control = AttemptControl(ctx)
        if outcome.kind != "completed" or outcome.committed or self.followups.has_hooks \
                or not control.staged_nothing() or self.followups.has_specs("completed", job.kind):
            return False
        control.seal()
        output = outcome.output_json if outcome.output_json is not None else ctx.output_json
        self.completer.complete(job.id, job.run_lease, output, slot=job.receipt_slot)
        return True

    async def finalize(self, job: Job, ctx: JobContext | None, outcome: Outcome, *,
                       allow_batch: bool) -> Finalized:
        """Apply the rules and write the result under the attempt's run lease."""
        if outcome.kind == "lost":  # caller-owned, stale lease: nothing committed
            return Finalized(outcome, written=False, trigger=None)
        if outcome.committed:  # caller-owned: committed with the handler's writes
            self.completer.count(job.queue, "completed")
            return Finalized(outcome, written=True, trigger=OUTCOMES["completed"].trigger)
        outcome, followups = self.resolve(job, ctx, outcome)
        trigger = OUTCOMES[outcome.kind].trigger
        if OUTCOMES[outcome.kind].batched and allow_batch:
            # Batched with other completions; wait for the batch to commit only
            # when something depends on it (follow-ups, hooks).
            future = self.completer.complete(job.id, job.run_lease, outcome.output_json,
                                             followups, wait=self.followups.has_hooks,
                                             slot=job.receipt_slot)
            if future is None:
                return Finalized(outcome, written=True, trigger=None)
            return Finalized(outcome, written=await future, trigger=trigger)
        progress = AttemptControl(ctx).take_progress() if ctx is not None else None
        written = await self.completer.write(job.id, job.run_lease, outcome, progress,
                                             followups, slot=job.receipt_slot)
        if written and OUTCOMES[outcome.kind].throughput:
            self.completer.count(job.queue, outcome.kind)
        return Finalized(outcome, written=written, trigger=trigger)
