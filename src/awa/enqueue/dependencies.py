"""Job dependencies: insert a job that waits for other jobs (``after=``).

A child waits as a ``scheduled`` job parked at `states.PARKED_RUN_AT`, with
one edge per parent in ``awa.job_dependencies``. It is released once its last
parent finishes: by the statement that finishes the parent (a trigger, the
job_dependencies migration) for the first 1,000 children, by the workers'
``release`` service in bounded chunks for the rest (migration 0019). It is
made available when every parent completed, or, when a parent failed or was
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from awa.core import states, validate
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.core.options import Policy as Policy  # its public path before core.options
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.enqueue import producer
from awa.enqueue.plan import Plan, Row, run
from awa.enqueue.producer import J, PreparedJob
from awa.telemetry import otel as telemetry

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
    """The ids ``after`` names (jobs, the bridge's job dicts, or ids), in order,
    duplicates dropped."""
    if isinstance(after, str | bytes | Mapping) or not isinstance(after, Iterable):
        raise ValidationError("after", "must be a list of jobs or job ids")
    ids: list[int] = []
    for item in after:
        value = validate.check_parent_id(item, item.get("id", item) if isinstance(item, Mapping)
                                         else getattr(item, "id", item))
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


Parents = tuple[list[int], Policy]
#: Parents found already finished at insert time: id -> (state, prune_after).
Finished = dict[int, tuple[str, datetime]]


def parents_many(count: int, opts: Sequence[Mapping[str, Any] | None] | None,
                 after: object, on_parent_failure: object
                 ) -> tuple[Sequence[Mapping[str, Any] | None] | None, list[Parents | None] | None]:
    """``after`` / ``on_parent_failure`` of a bulk insert, checked, for each job (None:
    no job waits), and ``opts`` without them: ``opts[i]`` may carry its own, which
    override the call's (``"after": None`` opts job ``i`` out)."""
    shared = None if after is None else parent_ids(after)
    policy = check_policy(on_parent_failure)
    if opts is None or not any(o and ("after" in o or "on_parent_failure" in o) for o in opts):
        if shared is None:
            parents_of(None, policy)  # a policy alone is refused
            return opts, None
        return opts, [(shared, policy)] * count
    cleaned: list[Mapping[str, Any] | None] = []
    parents: list[Parents | None] = []
    for i, own in enumerate(opts):
        if not own or ("after" not in own and "on_parent_failure" not in own):
            cleaned.append(own)
            parents.append(None if shared is None else (shared, policy))
            continue
        rest = dict(own)
        own_after = rest.pop("after", after)
        own_policy = rest.pop("on_parent_failure", policy)
        cleaned.append(rest)
        try:
            found = parents_of(own_after, own_policy if "on_parent_failure" in own else "cancel")
        except ValidationError as err:
            raise ValidationError(err.field, f"opts[{i}]: {err.rule}") from None
        parents.append(None if found is None else (found[0], check_policy(own_policy)))
    if shared is None and policy != "cancel" and not any(parents):
        parents_of(None, policy)
    return cleaned, parents if any(parents) else None


def check_parents(parents: Sequence[int], children: Iterable[Parents]) -> Plan[Finished]:
    """Lock and mark the active ``parents`` until this transaction ends; read the
    finished ones. Refuses unknown parents, and a ``discard`` child of a parent
    already failed or cancelled (there would be nothing to keep)."""
    yield "dependency_parents_to_mutable", (list(parents),)  # ring parents: available,
    yield "dependency_parents_materialize", (list(parents),)  # then running ones
    row = yield "dependency_lock_parents", (list(parents),)
    assert row is not None
    active = set(row["ids"])
    rest = [p for p in parents if p not in active]
    finished: Finished = {}
    if rest:
        row = yield "dependency_finished_parents", (rest,)
        assert row is not None
        finished = {int(i): (str(s), pa) for i, s, pa in zip(
            row["ids"], row["states"], row["prune_after"], strict=True)}
    unknown = [p for p in rest if p not in finished]
    if unknown:
        raise ValidationError("after", f"no job has id {unknown[0]}")
    failed = {p for p, (state, _) in finished.items() if state != "completed"}
    for ids, policy in children if failed else ():
        bad = next((p for p in ids if p in failed), None)
        if policy == "discard" and bad is not None:
            raise ValidationError("after", f"parent job {bad} already {finished[bad][0]}; "
                                  "with on_parent_failure='discard' there is nothing to insert")
    return finished


def release(finished: Finished, children: Sequence[int] | None = None) -> Plan[None]:
    """Apply the parents found already finished to their new ``children`` (None:
    to every open edge of those parents, as when the inserted ids are unknown)."""
    if finished:
        ids = list(finished)
        yield "dependency_release", (ids, [finished[p][0] for p in ids],
                                     [finished[p][1] for p in ids],
                                     None if children is None else list(children))


def insert_after_plan(job: PreparedJob, after: Sequence[int], policy: Policy) -> Plan[Row]:
    """`insert_after` as a plan (the bridge runs it on the caller's connection): the
    row of the inserted child, as it stands once finished parents applied."""
    job = parked(job, has_parents=True, has_children=False)
    finished = yield from check_parents(after, [(list(after), policy)])
    row = yield "job_insert", job.insert_params()
    assert row is not None
    child = int(row["id"])
    yield "dependency_insert_edges", ([child] * len(after), list(after),
                                      [policy] * len(after), list(range(len(after))))
    if finished:
        yield from release(finished, [child])
        row = yield "job_get", (child,)
        assert row is not None
    return row


async def insert_after(conn: Conn, q: Queries, job: PreparedJob, after: Sequence[int],
                       policy: Policy, *, job_type: type[J] = Job) -> J:  # type: ignore[assignment]
    """Insert ``job`` waiting for the jobs ``after`` (already validated), atomically.

    Active parents are locked and marked until this transaction ends; parents
    already finished apply at once (completed: done; failed or cancelled: the
    policy, except that ``discard`` refuses the insert, there being nothing to
    keep). Unknown parents raise `ValidationError` naming ``after``.
    """
    with translated():
        async with conn.transaction():  # a savepoint inside a caller's transaction
            row = await run(conn, q, insert_after_plan(job, after, policy))
    telemetry.inserted(job.kind, job.queue)
    return job_type.from_row(row)  # type: ignore[return-value]


def _staged(jobs: Sequence[PreparedJob], parents: Sequence[Parents | None]
            ) -> list[tuple[Any, ...]]:
    """Staging records of a bulk insert: a waiting job parked (as `parked`, without
    copying it), each record ending with the job's parents and policy."""
    records = []
    for job, p in zip(jobs, parents, strict=True):
        params = job.insert_params()
        if p is None:
            records.append((*params, None, None))
            continue
        if job.run_at is not None:
            parked(job, has_parents=True, has_children=False)  # raises: run_at with after
        records.append((*params[:3], states.PARKED_RUN_AT, *params[4:], p[0], p[1]))
    return records


async def _insert_staged(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                         parents: Sequence[Parents | None], statement: str) -> list[Any]:
    """Check the parents, stage the batch and run ``statement`` over it, then apply
    the parents already finished; the statement's rows (re-read if any applied)."""
    records = _staged(jobs, parents)
    with translated():
        async with conn.transaction():
            finished = await _lock_parents(conn, q, parents)
            await producer.stage(conn, q, records, with_parents=True)
            found = await conn.fetch(q[statement])
            if finished:
                ids = ([r["id"] for r in found]
                       if statement == "dependency_insert_from_staging" else None)
                await run(conn, q, release(finished, ids))
                if statement == "dependency_insert_from_staging":
                    found = await conn.fetch(q["dependency_jobs_get"],
                                             [r["id"] for r in found])
    return found


async def insert_many_after(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                            parents: Sequence[Parents | None],
                            job_type: type[J] = Job,  # type: ignore[assignment]
                            copy: bool | None = None) -> list[J]:
    """`producer.insert_many` for a batch where ``parents[i]`` is what job ``i`` waits
    for (None: nothing): the same checks and atomicity as `insert_after`, one
    lock statement, then the jobs and their edges in one statement: the
    columns as arrays (``copy`` as in `producer.insert_many`: by size), or
    staged by COPY. The jobs come back in the order of ``jobs``."""
    if producer.one_statement(jobs, copy):
        rows = await _insert_array(conn, q, jobs, parents)
    else:
        rows = await _insert_staged(conn, q, jobs, parents, "dependency_insert_from_staging")
    inserted: list[J] = [job_type.from_row(r) for r in rows]  # type: ignore[misc]
    telemetry.inserted_jobs(inserted)
    return inserted


async def _insert_array(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                        parents: Sequence[Parents | None],
                        statement: str = "dependency_insert_many") -> list[Any]:
    """`_insert_staged` without the staging table: ``statement`` (``dependency_insert_many``
    or ``dependency_count_many``) over the batch as arrays (the jobs that wait
    parked), one round trip."""
    ready = [job if p is None else parked(job, has_parents=True, has_children=False)
             for job, p in zip(jobs, parents, strict=True)]
    after = [None if p is None else "{" + ",".join(map(str, p[0])) + "}" for p in parents]
    policies = [None if p is None else p[1] for p in parents]
    with translated():
        async with conn.transaction():
            finished = await _lock_parents(conn, q, parents)
            rows = await conn.fetch(q[statement], *producer.array_params(ready), after,
                                    policies)
            if finished:
                ids = [r["id"] for r in rows] if statement == "dependency_insert_many" else None
                await run(conn, q, release(finished, ids))
                if statement == "dependency_insert_many":
                    rows = await conn.fetch(q["dependency_jobs_get"],
                                            [r["id"] for r in rows])
    return list(rows)


async def copy_many_after(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                          parents: Sequence[Parents | None]) -> int:
    """`insert_many_after` answering only how many jobs it inserted (`enqueue_many_copy`):
    a small batch as one statement; a larger one with the jobs that wait for
    nothing by binary COPY straight into the jobs table, the others staged."""
    if any(j.unique_key is not None for j in jobs):  # which ones were skipped: the rows say
        return len(await insert_many_after(conn, q, jobs, parents))
    if producer.one_statement(jobs, None):
        rows = await _insert_array(conn, q, jobs, parents, "dependency_count_many")
        count = int(rows[0]["inserted"])
    elif all(p is not None for p in parents):
        rows = await _insert_staged(conn, q, jobs, parents, "dependency_count_from_staging")
        count = int(rows[0]["inserted"])
    else:
        plain, waiting = _split(parents)
        records = _staged([jobs[i] for i in waiting], [parents[i] for i in waiting])
        with translated():
            async with conn.transaction():
                finished, ids = await _reserve(conn, q, parents)
                count = await producer.copy_records(conn, q, [jobs[i] for i in plain],
                                                    ids=[ids[i] for i in plain])
                await producer.stage(conn, q, [(*r, ids[i]) for r, i in zip(records, waiting,
                                                                           strict=True)],
                                     with_parents=True, with_ids=True)
                row = await conn.fetchrow(q["dependency_count_from_staging"])
                assert row is not None
                count += int(row["inserted"])
                if finished:
                    await run(conn, q, release(finished, ids))
    telemetry.inserted_jobs(jobs)
    return count


def _split(parents: Sequence[Parents | None]) -> tuple[list[int], list[int]]:
    """The positions of the jobs that wait for nothing, and of those that wait."""
    plain = [i for i, p in enumerate(parents) if p is None]
    return plain, [i for i, p in enumerate(parents) if p is not None]


async def _lock_parents(conn: Conn, q: Queries, parents: Sequence[Parents | None]) -> Finished:
    """`check_parents` for the parents the waiting jobs name, each once."""
    children = [p for p in parents if p is not None]
    wanted = list(dict.fromkeys(i for ids, _ in children for i in ids))
    return await run(conn, q, check_parents(wanted, children))


async def _reserve(conn: Conn, q: Queries, parents: Sequence[Parents | None]
                   ) -> tuple[Finished, list[int]]:
    """A mixed batch's first statements: its parents checked and locked, then an
    id per job in the batch's order, so the jobs keep that order whichever path
    inserts them."""
    finished = await _lock_parents(conn, q, parents)
    row = await conn.fetchrow(q["job_ids_reserve"], len(parents))
    assert row is not None
    return finished, list(row["ids"])


async def insert_graph(conn: Conn, q: Queries,
                       nodes: Sequence[tuple[PreparedJob, Sequence[int], Policy]],
                       external: Sequence[int] = ()) -> list[Job]:
    """Insert jobs and their edges in one transaction; ``nodes[i]`` names its
    parents by their index in ``nodes`` (always earlier ones). The jobs that wait
    for nothing in ``nodes`` wait for the existing jobs ``external`` (ids, checked
    as `insert_after` checks them), each with its own policy."""
    has_children = {p for _, parents, _ in nodes for p in parents}
    ready = [parked(job, has_parents=bool(parents or external), has_children=i in has_children)
             for i, (job, parents, _) in enumerate(nodes)]
    jobs: list[Job] = []
    children: list[int] = []
    parents_of: list[int] = []
    policies: list[str] = []
    ordinals: list[int] = []
    with translated():
        async with conn.transaction():
            finished: Finished = {}
            if external:
                finished = await run(conn, q, check_parents(
                    external, [(list(external), policy) for _, ps, policy in nodes if not ps]))
            for job, (_, parents, policy) in zip(ready, nodes, strict=True):
                row = await conn.fetchrow(q["job_insert"], *job.insert_params())
                assert row is not None
                jobs.append(Job.from_row(row))
                targets = [jobs[p].id for p in parents] if parents else list(external)
                children.extend([jobs[-1].id] * len(targets))
                parents_of.extend(targets)
                policies.extend([policy] * len(targets))
                ordinals.extend(range(len(targets)))
            if children:
                await conn.execute(q["dependency_insert_edges"], children, parents_of,
                                   policies, ordinals)
            if finished:
                jobs = await _reread(conn, q, jobs, finished)
    telemetry.inserted_jobs(jobs)
    return jobs


async def _reread(conn: Conn, q: Queries, jobs: list[Job], finished: Finished) -> list[Job]:
    """Apply finished parents to a just-inserted workflow and read its jobs again;
    refuses (rolling it all back) a workflow that a parent discards in part."""
    await run(conn, q, release(finished, [j.id for j in jobs]))
    rows = {r["id"]: r for r in await conn.fetch(q["dependency_jobs_get"],
                                                  [j.id for j in jobs])}
    gone = next((j for j in jobs if j.id not in rows), None)
    if gone is not None:
        failed = next(p for p, (state, _) in finished.items() if state != "completed")
        raise ValidationError("after", f"parent job {failed} already {finished[failed][0]}: "
                              f"it would discard workflow job {gone.kind!r} at once, "
                              "with nothing to keep of it")
    return [Job.from_row(rows[j.id]) for j in jobs]


async def parent_outputs(conn: Conn, q: Queries, job_id: int) -> list[ParentResult]:
    """The parents of ``job_id`` in ``after=`` order, with their retained outputs."""
    with translated():
        rows = await conn.fetch(q["dependency_parent_outputs"], job_id)
    return [ParentResult(r["id"], r["kind"], r["state"], r["output"]) for r in rows]
