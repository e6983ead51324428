"""Workflows: ``chain``, ``group`` and ``chord`` of jobs, inserted atomically.

The Celery canvas, on Awa's dependencies (`awa.enqueue.dependencies`):

- ``chain(a, b, c)``: b waits for a, c for b;
- ``group(a, b, c)``: run side by side; whatever follows a group waits for all of them;
- ``chord(group(a, b), callback)``: the callback waits for the whole group and
  reads their outputs with ``await job.parent_outputs()``.

Nodes nest (a chain of groups, a group of chains...). A node is the job's
args, or ``step(args, **insert_options)`` for options. A workflow can start
after jobs that already exist (``enqueue_workflow(flow, after=[job, id])``):
its first jobs wait for them as ``insert(after=...)`` would. The whole workflow is
validated before anything is written, then inserted in one transaction:
every job or none (a `UniqueConflict` of one step rolls back all of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from awa.core import states
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.core.options import Policy
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.enqueue import producer
from awa.enqueue.dependencies import check_policy, insert_graph, parent_ids
from awa.enqueue.producer import PreparedJob, Router


@dataclass(frozen=True, slots=True)
class Step:
    """One job of a workflow: its args, insert options and parent-failure policy."""

    args: Any
    options: dict[str, Any] = field(default_factory=dict)
    on_parent_failure: Policy = "cancel"


@dataclass(frozen=True, slots=True)
class Chain:
    """Nodes run one after another."""

    nodes: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """Nodes run side by side."""

    nodes: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Chord:
    """A group, then a callback that waits for every job of it."""

    header: Group
    body: Any


Node = Step | Chain | Group | Chord


def step(args: Any, *, on_parent_failure: Policy = "cancel", **options: Any) -> Step:
    """A workflow job with insert options (queue, priority, tags, ...) and the
    policy for a parent that fails (default ``"cancel"``)."""
    if "run_at" in options:
        raise ValidationError("run_at", "a workflow step runs when its parents finish; "
                              "run_at is not accepted")
    return Step(args, dict(options), check_policy(on_parent_failure))


def chain(*nodes: Any) -> Chain:
    """``chain(a, b, c)``: b starts when a completed, c when b completed."""
    if not nodes:
        raise ValidationError("chain", "needs at least one job")
    return Chain(tuple(nodes))


def group(*nodes: Any) -> Group:
    """``group(a, b, c)``: side by side; what follows waits for all of them."""
    if len(nodes) == 1 and isinstance(nodes[0], list | tuple):
        nodes = tuple(nodes[0])
    if not nodes:
        raise ValidationError("group", "needs at least one job")
    return Group(tuple(nodes))


def chord(header: Group | Sequence[Any], body: Any) -> Chord:
    """``chord(group(a, b), callback)``: the callback waits for a and b."""
    return Chord(header if isinstance(header, Group) else group(*header), body)


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """An inserted workflow: its jobs in insertion order."""

    jobs: list[Job]
    tails: list[Job]  #: the jobs nothing in the workflow waits for (a chord's callback)

    @property
    def id(self) -> int:
        """The first job's id; ``awa workflow show`` finds the whole graph from any job."""
        return self.jobs[0].id


_Flat = list[tuple[PreparedJob, list[int], Policy]]


def flatten(node: Any, router: Router | None = None) -> tuple[_Flat, list[int]]:
    """Validate and order the workflow's jobs (parents before children); also
    the indexes of its tails."""
    flat: _Flat = []

    def add(n: Any, parents: list[int]) -> list[int]:
        if isinstance(n, Chain):
            for sub in n.nodes:
                parents = add(sub, parents)
            return parents
        if isinstance(n, Group):
            return [t for sub in n.nodes for t in add(sub, parents)]
        if isinstance(n, Chord):
            return add(n.body, add(n.header, parents))
        s = n if isinstance(n, Step) else Step(n)
        if len(flat) >= states.WORKFLOW_JOBS_MAX:
            raise ValidationError("workflow", f"at most {states.WORKFLOW_JOBS_MAX} jobs")
        if len(parents) > states.DEPENDENCY_PARENTS_MAX:
            raise ValidationError("workflow", f"a job may wait for at most "
                                  f"{states.DEPENDENCY_PARENTS_MAX} jobs")
        flat.append((producer.prepare(s.args, **s.options, router=router), list(parents),
                     s.on_parent_failure))
        return [len(flat) - 1]

    tails = add(node, [])
    return flat, tails


async def insert_workflow(conn: Conn, q: Queries, node: Any, router: Router | None = None,
                          after: Iterable[Any] | None = None) -> WorkflowRun:
    """Validate ``node`` whole, then insert every job and edge in one transaction.

    ``after``: existing jobs (or ids) that the workflow's first jobs (those
    waiting for nothing inside it) wait for, each with its own policy."""
    flat, tails = flatten(node, router)
    external = parent_ids(after) if after is not None else []
    jobs = await insert_graph(conn, q, flat, external)
    return WorkflowRun(jobs, [jobs[i] for i in tails])
