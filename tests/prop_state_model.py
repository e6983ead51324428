"""The model behind `tests.test_properties_state`: what every job should be.

Each `MJob` records where a job lives (``jobs``, ``done``, ``dlq`` or ``gone``),
its state, attempt, run lease, unique key and callback. `Model` predicts the
effect of each operation from the transition table (`awa.core.states.TRANSITIONS`),
callbacks waited on in the running handler and follow-ups staged with the
completion, and `Model.check` compares the database with the prediction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tests.prop_support import STATE_BITS

import awa
from awa.admin.dlq import DlqEntry
from awa.core import serialize, validate
from awa.core.model import Job, RetryFailedResult

QUEUES = ("q1", "q2")
DLQ_QUEUE = "q2"
FQ = "fq"
#: Unique-state masks a caller might choose: the default, without completed,
#: with failed and cancelled, with waiting_external, and every state.
MASKS = (0x1F, 0x17, 0x7F, 0x9F, 0xFF)
SNAPSHOT = ("state", "attempt", "run_lease", "errors", "metadata", "finalized_at", "args",
            "progress", "queue", "priority", "tags")


@dataclass
class Task:
    n: int
    group: int


@dataclass
class Plain:
    n: int
    group: int


@dataclass
class FollowUp:
    src: int


@dataclass
class Grouped:
    group: int


@dataclass
class Exhausted:
    src: int


@dataclass
class Staged:
    src: int
    lease: int


@dataclass
class StagedKey:
    group: int


@dataclass
class Behavior:
    """What the handler of one attempt does."""

    outcome: str = "complete"
    stage: str = "none"  #: none | plain | unique | poison (a swallowed StagingError)
    early: str = "none"  #: with outcome "wait": resolve the callback before returning
    batch: bool = False  #: completions may take the batched path

    @property
    def registers(self) -> bool:
        return self.outcome == "wait"


class Host(Protocol):
    behavior: Behavior
    tokens: list[str]
    client: awa.AsyncClient


def handler_for(host: Host) -> Callable[[Any], Any]:
    """One handler for every claimed kind; it does what ``host.behavior`` says."""
    async def handler(job: Any) -> object:
        b = host.behavior
        if b.stage == "plain":
            job.enqueue_on_completion(Staged(job.id, job.run_lease), queue=FQ)
        elif b.stage == "unique":
            job.enqueue_on_completion(StagedKey(job.args.group), queue=FQ, unique_opts={})
        elif b.stage == "poison":
            try:
                job.enqueue_on_completion(Staged(job.id, job.run_lease), queue=FQ, priority=9)
            except awa.StagingError:
                pass
        results: dict[str, object] = {
            "complete": None, "output": awa.Output({"n": job.args.n}),
            "retry_after": awa.RetryAfter(3600), "snooze": awa.Snooze(3600),
            "cancel": awa.Cancel("by handler"),
            "wait_unregistered": awa.WaitForCallback(awa.CallbackToken.new())}
        if b.outcome in results:
            return results[b.outcome]
        if b.outcome == "raise":
            raise RuntimeError("boom")
        if b.outcome == "terminal":
            raise awa.TerminalError("fatal")
        token = await job.register_callback(timeout_seconds=3600)
        host.tokens.append(token.id)
        c = host.client
        if b.early == "complete":
            await c.complete_external(token.id, {"early": True})
        elif b.early == "resume":
            await c.resume_external(token.id, {"early": True})
        elif b.early == "retry":
            await c.retry_external(token.id)
        elif b.early == "fail":
            await c.fail_external(token.id, "early failure")
        return awa.WaitForCallback(token)
    return handler


@dataclass
class MJob:
    """The model of one job."""

    id: int
    kind: str
    queue: str
    group: int
    max_attempts: int
    state: str
    table: str = "jobs"
    attempt: int = 0
    lease: int = 0
    key: bytes | None = None
    mask: int = 0
    callback: str | None = None
    snapshot: dict[str, Any] | None = None
    n: int = 0
    unique_opts: dict[str, Any] | None = None


@dataclass
class Model:
    """Every job the test made, and the follow-ups their outcomes must have made."""

    jobs: dict[int, MJob] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    follow_up: Counter[int] = field(default_factory=Counter)
    grouped: set[int] = field(default_factory=set)
    exhausted: Counter[int] = field(default_factory=Counter)
    staged: Counter[tuple[int, int]] = field(default_factory=Counter)
    staged_key: set[int] = field(default_factory=set)

    @property
    def max_id(self) -> int:
        return max(self.jobs, default=0)

    def add(self, job: MJob) -> None:
        self.jobs[job.id] = job

    def any_active(self, state: str) -> bool:
        return any(j.table == "jobs" and j.state == state for j in self.jobs.values())

    def live(self) -> list[MJob]:
        return [j for j in self.jobs.values() if j.table != "gone"]

    def pick(self, i: int, pred: Callable[[MJob], bool] | None = None) -> MJob | None:
        """The ``i``-th job (modulo) among those matching ``pred`` (any job, even gone)."""
        pool = [j for _, j in sorted(self.jobs.items()) if pred is None or pred(j)]
        return pool[i % len(pool)] if pool else None

    # -- unique keys ------------------------------------------------------------------

    def conflict(self, changes: dict[int, str], extra: list[MJob] = ()) -> bool:  # type: ignore[assignment]
        """Would these state changes leave two jobs holding one unique key?"""
        holders: Counter[bytes] = Counter()
        for j in [*self.live(), *extra]:
            state = changes.get(j.id, j.state)
            if j.key is not None and j.mask & STATE_BITS[state]:
                holders[j.key] += 1
        return any(n > 1 for n in holders.values())

    def drainable_parked(self, queue: str) -> list[MJob]:
        """The parked jobs of ``queue`` a drain cancels: those whose cancelled state
        takes no key another job holds (of two sharing a free key, the first)."""
        parked = sorted((j for j in self.live() if j.queue == queue and j.table == "jobs"
                         and j.state == "waiting_external"), key=lambda j: j.id)
        out = []
        for j in parked:
            first = min(p.id for p in parked if p.key == j.key) == j.id
            held = any(o.id != j.id and o.key == j.key and o.mask & STATE_BITS[o.state]
                       for o in self.live())
            if j.key is None or not j.mask & STATE_BITS["cancelled"] or (not held and first):
                out.append(j)
        return out

    def plan_inserts(self, kind: str, queue: str, batch: list[tuple[int, int]],
                     unique: dict[str, Any] | None, state: str,
                     max_attempts: int) -> list[MJob | None]:
        """The jobs an insert makes, None where a duplicate key is refused or skipped."""
        parsed = validate.parse_unique_opts(unique)
        planned: list[MJob] = []
        out: list[MJob | None] = []
        for n, group in batch:
            job = MJob(-1 - len(planned), kind, queue, group, max_attempts, state, n=n,
                       unique_opts=unique)
            if parsed is not None:
                by_queue, by_args, period, mask = parsed
                job.key = serialize.unique_key(kind, queue, {"n": n, "group": group}, by_queue,
                                              by_args, period)
                job.mask = mask
            if self.conflict({}, [*planned, job]):
                out.append(None)
                continue
            planned.append(job)
            out.append(job)
        return out

    # -- transitions ------------------------------------------------------------------

    def to_done(self, j: MJob, state: str) -> None:
        j.table, j.state, j.callback, j.snapshot = "done", state, None, None

    def to_dlq(self, j: MJob) -> None:
        j.table, j.state, j.callback, j.snapshot = "dlq", "failed", None, None

    def to_available(self, j: MJob, *, reset_attempt: bool) -> None:
        j.table, j.state, j.callback, j.snapshot = "jobs", "available", None, None
        if reset_attempt:
            j.attempt = 0

    def retried_externally(self, j: MJob) -> None:
        """retry_external: the next run is a new attempt, and there always is one more."""
        self.to_available(j, reset_attempt=False)
        j.attempt = min(j.attempt, j.max_attempts - 1)

    def remove(self, j: MJob) -> None:
        j.table = "gone"

    def claim(self, j: MJob) -> None:
        j.state, j.callback = "running", None
        j.attempt += 1
        j.lease += 1

    def fail(self, j: MJob, *, trigger: bool) -> None:
        """A terminal failure: to the DLQ on the dead-lettering queue; specs fire if ``trigger``."""
        if j.queue == DLQ_QUEUE:
            self.to_dlq(j)
        else:
            self.to_done(j, "failed")
        if trigger and j.kind == "task":
            self.exhausted[j.id] += 1

    def complete(self, j: MJob, *, stage: str | None) -> None:
        """Completed; registered specs fire; ``stage`` is set only for the handler's own."""
        if j.kind == "task":
            self.follow_up[j.id] += 1
            self.grouped.add(j.group)
        if stage == "plain":
            self.staged[(j.id, j.lease)] += 1
        elif stage == "unique":
            self.staged_key.add(j.group)
        self.to_done(j, "completed")

    def finish(self, j: MJob, b: Behavior, token: str | None) -> None:
        """The handler's outcome, written under its (current) lease."""
        exhausted = j.attempt >= j.max_attempts
        o = b.outcome
        if o in ("complete", "output"):
            if b.stage == "poison":
                self.fail(j, trigger=True)
            else:
                self.complete(j, stage=b.stage)
        elif o in ("raise", "retry_after"):
            if exhausted:
                self.fail(j, trigger=True)
            else:
                j.state = "retryable"
        elif o in ("terminal", "wait_unregistered"):
            self.fail(j, trigger=True)
        elif o == "snooze":
            j.state, j.attempt = "scheduled", max(j.attempt - 1, 0)
        elif o == "cancel":
            self.to_done(j, "cancelled")
        elif b.early == "none":
            j.state, j.callback = "waiting_external", token
        elif b.early == "complete":
            self.complete(j, stage=None)
        elif b.early == "fail":
            self.fail(j, trigger=True)
        elif b.early == "retry":
            self.retried_externally(j)
        else:  # resumed before it parked: re-dispatched to continue the same attempt
            self.to_available(j, reset_attempt=False)
            j.attempt = max(j.attempt - 1, 0)

    # -- expected results of calls ------------------------------------------------------

    def expect_cancel(self, j: MJob, result: Any) -> None:
        if j.table == "gone":
            assert isinstance(result, awa.JobNotFound), result
        elif j.table == "jobs":
            assert isinstance(result, Job) and str(result.state) == "cancelled", result
            self.to_done(j, "cancelled")
        else:
            assert result is None, result

    def expect_admin_retry(self, j: MJob, result: Any) -> None:
        if j.table == "gone":
            assert isinstance(result, awa.JobNotFound), result
            return
        if not ((j.table == "done" and j.state in ("failed", "cancelled"))
                or (j.table == "jobs" and j.state == "waiting_external")):
            assert isinstance(result, awa.ValidationError), result
            return
        if self.conflict({j.id: "available"}):
            assert isinstance(result, awa.UniqueConflict), result
            return
        assert isinstance(result, Job) and result.attempt == 0, result
        self.to_available(j, reset_attempt=True)

    def expect_bulk_retry(self, jobs: list[MJob], result: Any) -> None:
        if self.conflict({j.id: "available" for j in jobs}):
            assert isinstance(result, awa.UniqueConflict), result
            return
        n = result.matched if isinstance(result, RetryFailedResult) else result
        assert n == len(jobs), (result, jobs)
        for j in jobs:
            self.to_available(j, reset_attempt=True)

    def expect_dlq(self, j: MJob, verb: str, result: Any) -> None:
        if verb == "move":
            if j.table == "done" and j.state == "failed":
                assert isinstance(result, DlqEntry), result
                self.to_dlq(j)
            else:
                assert result is None, result
        elif verb == "purge":
            assert result is (j.table == "dlq"), result
            if j.table == "dlq":
                self.remove(j)
        elif j.table != "dlq":
            assert result is None, result
        elif self.conflict({j.id: "available"}):
            assert isinstance(result, awa.UniqueConflict), result
        else:
            assert isinstance(result, Job) and result.attempt == 0, result
            self.to_available(j, reset_attempt=True)

    def expect_resolution(self, cid: str, action: str, result: Any) -> None:
        waiting = [j for j in self.live() if j.callback == cid]
        if not waiting:
            assert isinstance(result, awa.CallbackNotFound), result
            return
        j = waiting[0]
        target = {"complete": "completed", "fail": "failed", "retry": "available",
                  "resume": "available", "heartbeat": j.state}[action]
        if self.conflict({j.id: target}):
            assert isinstance(result, awa.UniqueConflict), result
            return
        assert isinstance(result, Job), result
        if action == "complete":
            self.complete(j, stage=None)
        elif action == "fail":
            self.fail(j, trigger=True)
        elif action == "retry":
            self.retried_externally(j)
        elif action == "resume":  # parked, no live handler: re-dispatched, same attempt
            self.to_available(j, reset_attempt=False)
            j.attempt = max(j.attempt - 1, 0)

    def expect_rescue(self, j: MJob, *, callback: bool) -> None:
        target = "failed" if j.attempt >= j.max_attempts else "retryable"
        if callback and j.mask & STATE_BITS[target] and any(
                o.id != j.id and o.key == j.key and o.mask & STATE_BITS[o.state]
                for o in self.live()):  # its unique key was taken while it waited
            if not j.mask & STATE_BITS["failed"]:
                self.fail(j, trigger=False)
            return  # else it stays parked, checked again later
        if j.attempt >= j.max_attempts:
            self.fail(j, trigger=False)
        else:
            j.state, j.callback = "retryable", None

    # -- the comparison ---------------------------------------------------------------

    def check(self, actual: dict[int, dict[str, Any]]) -> None:
        """The database holds exactly the modelled jobs and the follow-ups owed."""
        rows = dict(actual)
        for j in self.jobs.values():
            r = rows.pop(j.id, None)
            if j.table == "gone":
                assert r is None, f"job {j.id} should be gone"
                continue
            assert r is not None, f"job {j.id} is missing"
            got = (r["tbl"], r["state"], r["attempt"], r["run_lease"])
            assert got == (j.table, j.state, j.attempt, j.lease), (j, got)
            if j.state == "waiting_external":
                assert str(r["callback_id"]) == j.callback, (j, r["callback_id"])
            if j.table != "jobs":
                snap = {k: r[k] for k in SNAPSHOT}
                if j.snapshot is None:
                    j.snapshot = snap
                assert snap == j.snapshot, f"terminal job {j.id} changed: {j.snapshot} -> {snap}"
        found: dict[str, Counter[Any]] = {k: Counter() for k in (
            "follow_up", "grouped", "exhausted", "staged", "staged_key")}
        for r in rows.values():
            a = r["args"]
            assert r["queue"] == FQ and r["state"] == "available", f"unexpected job {r}"
            key = (a["src"], a["lease"]) if r["kind"] == "staged" else a.get("src", a.get("group"))
            found[r["kind"]][key] += 1
        follow, grouped, exhausted = found["follow_up"], found["grouped"], found["exhausted"]
        staged, staged_key = found["staged"], found["staged_key"]
        assert follow == self.follow_up, (follow, self.follow_up)
        assert exhausted == self.exhausted, (exhausted, self.exhausted)
        assert staged == self.staged, (staged, self.staged)
        assert grouped == Counter(self.grouped), (grouped, self.grouped)
        assert staged_key == Counter(self.staged_key), (staged_key, self.staged_key)
        assert all(n == 1 for n in Counter(src for src, _ in staged.elements()).values())
