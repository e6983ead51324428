"""Job dependencies: insert a job that waits for other jobs (``after=``).

A child waits as a ``scheduled`` job parked at `states.PARKED_RUN_AT`, with
one edge per parent in ``awa.job_dependencies``. It is released by the
statement that finishes its last parent (a trigger, the job_dependencies migration): made
available when every parent completed, or, when a parent failed or was
cancelled, handled by its ``on_parent_failure`` policy:

- ``"cancel"`` (default): the child is cancelled (an error entry names the parent);
- ``"run_anyway"``: that parent counts as done; the child runs once all are;
- ``"discard"``: the child is deleted, as if never enqueued (``get_job``
  raises `JobNotFound`); the edges stay, so the workflow graph shows it.

A child cancelled or discarded this way releases its own children as a
cancelled parent. Cycles cannot be built: parents must exist before the
child, so a job can never wait, directly or not, for itself.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from awa.core import states
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.enqueue.producer import J, PreparedJob
from awa.telemetry import otel as telemetry

Policy = Literal["cancel", "run_anyway", "discard"]
#: The metadata key that marks a job with dependents (its finish releases them).
DEPENDENTS_KEY = "_awa_dependents"


@dataclass(frozen=True, slots=True)
class ParentResult:
    """One parent of a job, as its child sees it (`JobContext.parent_outputs`)."""

    id: int
    kind: str | None  #: None once the parent's row was pruned
    state: str | None  #: completed, failed, cancelled; None if it was never resolved
    output: Any  #: the parent's retained output (``Output(...)`` / ``set_output``)


def check_policy(policy: object) -> Policy:
    """``on_parent_failure`` must name one of the policies."""
    if policy not in states.PARENT_FAILURE_POLICIES:
        raise ValidationError("on_parent_failure",
                              f"must be one of {', '.join(states.PARENT_FAILURE_POLICIES)}")
    return cast(Policy, policy)


def parents_of(after: object, on_parent_failure: object) -> tuple[list[int], Policy] | None:
    """``after`` and ``on_parent_failure`` of an insert, checked: None when the job
    waits for nothing (a policy without ``after`` is refused)."""
    if after is None:
        if on_parent_failure != "cancel":
            raise ValidationError("on_parent_failure", "only applies together with after")
        return None
    return parent_ids(after), check_policy(on_parent_failure)


def parent_ids(after: object) -> list[int]:
    """The ids ``after`` names (jobs or ids), in order, duplicates dropped."""
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise ValidationError("after", "must be a list of jobs or job ids")
    ids: list[int] = []
    for item in after:
        value = getattr(item, "id", item)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValidationError("after", f"{item!r} is neither a job nor a job id")
        if value not in ids:
            ids.append(value)
    if not ids:
        raise ValidationError("after", "must name at least one job")
    if len(ids) > states.DEPENDENCY_PARENTS_MAX:
        raise ValidationError("after", f"at most {states.DEPENDENCY_PARENTS_MAX} parents")
    return ids


def parked(job: PreparedJob, *, has_parents: bool, has_children: bool) -> PreparedJob:
    """``job`` as a workflow inserts it: parked if it waits, marked if others wait on it."""
    if has_parents and job.run_at is not None:
        raise ValidationError("run_at", "cannot be combined with after: a job waiting for "
                              "other jobs runs when they finish")
    changes: dict[str, Any] = {}
    if has_parents:
        changes["run_at"] = states.PARKED_RUN_AT
    if has_children:
        metadata = json.loads(job.metadata_json)
        metadata[DEPENDENTS_KEY] = True
        changes["metadata_json"] = json.dumps(metadata, separators=(",", ":"))
    return dataclasses.replace(job, **changes) if changes else job


async def insert_after(conn: Conn, q: Queries, job: PreparedJob, after: Sequence[int],
                       policy: Policy, *, job_type: type[J] = Job) -> J:  # type: ignore[assignment]
    """Insert ``job`` waiting for the jobs ``after`` (already validated), atomically.

    Active parents are locked and marked until this transaction ends; parents
    already finished apply at once (completed: done; failed or cancelled: the
    policy, except that ``discard`` refuses the insert, there being nothing to
    keep). Unknown parents raise `ValidationError` naming ``after``.
    """
    job = parked(job, has_parents=True, has_children=False)
    with translated():
        async with conn.transaction():  # a savepoint inside a caller's transaction
            active = {r["id"] for r in await conn.fetch(q["dependency_lock_parents"],
                                                         list(after))}
            rest = [p for p in after if p not in active]
            finished = {r["id"]: r for r in await conn.fetch(q["dependency_finished_parents"],
                                                              rest)} if rest else {}
            unknown = [p for p in rest if p not in finished]
            if unknown:
                raise ValidationError("after", f"no job has id {unknown[0]}")
            failed = [p for p, r in finished.items() if r["state"] != "completed"]
            if failed and policy == "discard":
                raise ValidationError("after", f"parent job {failed[0]} already "
                                      f"{finished[failed[0]]['state']}; with "
                                      "on_parent_failure='discard' there is nothing to insert")
            row = await conn.fetchrow(q["job_insert"], *job.insert_params())
            assert row is not None
            child = int(row["id"])
            await conn.execute(q["dependency_insert_edges"], [child] * len(after), list(after),
                               [policy] * len(after), list(range(len(after))))
            for p in after:
                if p in finished:
                    await conn.execute(q["dependency_release"], p, finished[p]["state"],
                                       finished[p]["prune_after"])
            if finished:
                row = await conn.fetchrow(q["job_get"], child)
                assert row is not None
    telemetry.inserted(job.kind, job.queue)
    return job_type.from_row(row)  # type: ignore[return-value]


async def insert_graph(conn: Conn, q: Queries,
                       nodes: Sequence[tuple[PreparedJob, Sequence[int], Policy]]) -> list[Job]:
    """Insert jobs and their edges in one transaction; ``nodes[i]`` names its
    parents by their index in ``nodes`` (always earlier ones)."""
    has_children = {p for _, parents, _ in nodes for p in parents}
    jobs: list[Job] = []
    children: list[int] = []
    parents_of: list[int] = []
    policies: list[str] = []
    ordinals: list[int] = []
    with translated():
        async with conn.transaction():
            for i, (job, parents, policy) in enumerate(nodes):
                job = parked(job, has_parents=bool(parents), has_children=i in has_children)
                row = await conn.fetchrow(q["job_insert"], *job.insert_params())
                assert row is not None
                jobs.append(Job.from_row(row))
                for n, p in enumerate(parents):
                    children.append(jobs[-1].id)
                    parents_of.append(jobs[p].id)
                    policies.append(policy)
                    ordinals.append(n)
            if children:
                await conn.execute(q["dependency_insert_edges"], children, parents_of,
                                   policies, ordinals)
    telemetry.inserted_jobs(jobs)
    return jobs


async def parent_outputs(conn: Conn, q: Queries, job_id: int) -> list[ParentResult]:
    """The parents of ``job_id`` in ``after=`` order, with their retained outputs."""
    with translated():
        rows = await conn.fetch(q["dependency_parent_outputs"], job_id)
    return [ParentResult(r["id"], r["kind"], r["state"], r["output"]) for r in rows]
