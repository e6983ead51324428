"""Reading a workflow: the graph of jobs connected to one job by dependencies.

Shared by ``client.workflow(job_id)``, ``awa workflow show`` and the web UI's
job page. Edges are kept after their parent finishes (pruned by cleanup after
`states.DEPENDENCY_RETENTION`), so a finished workflow can still be drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from awa.core import validate
from awa.core.errors import JobNotFound
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries

#: Most jobs one graph read returns (the ones with the lowest ids).
GRAPH_LIMIT = 500


@dataclass(frozen=True, slots=True)
class Edge:
    """One parent of a node, with the child's policy and how the parent finished."""

    parent_id: int
    policy: str
    parent_state: str | None  #: None while the parent has not finished
    resolved_at: str | None


@dataclass(frozen=True, slots=True)
class WorkflowNode:
    """A job of the graph. ``state`` None: discarded, deleted by hand, or pruned
    past its retention (see `status`)."""

    id: int
    kind: str | None
    queue: str | None
    state: str | None
    attempt: int | None
    parents: list[Edge] = field(default_factory=list)

    @property
    def waiting_on(self) -> int:
        """Parents not finished yet (a parked job runs when this reaches 0)."""
        return sum(1 for e in self.parents if e.parent_state is None)

    @property
    def status(self) -> str:
        """The state as a reader wants it: a parked job is ``waiting`` on its parents."""
        if self.state == "scheduled" and self.waiting_on:
            return "waiting"
        if self.state is not None:
            return self.state
        # No row: discarded by its policy when a parent failed, else gone (deleted
        # by hand, or pruned), which a parent deleted with SQL is.
        discarded = any(e.policy == "discard" and e.parent_state not in (None, "completed")
                        for e in self.parents)
        return "discarded" if discarded else "gone"


@dataclass(frozen=True, slots=True)
class WorkflowGraph:
    """Every job connected to ``root`` through dependencies, parents before children
    (ascending ids: a child is always inserted after its parents)."""

    root: int
    nodes: list[WorkflowNode]
    truncated: bool

    def layers(self) -> list[list[WorkflowNode]]:
        """Nodes by depth: a node's layer is one more than its deepest parent's."""
        depth: dict[int, int] = {}
        for n in self.nodes:
            depth[n.id] = 1 + max((depth.get(e.parent_id, -1) for e in n.parents), default=-1)
        out: list[list[WorkflowNode]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for n in self.nodes:
            out[depth[n.id]].append(n)
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the CLI's --json and the UI's API."""
        return {"root": self.root, "truncated": self.truncated, "nodes": [
            {"id": n.id, "kind": n.kind, "queue": n.queue, "state": n.state,
             "status": n.status, "attempt": n.attempt, "waiting_on": n.waiting_on,
             "parents": [_edge_dict(e) for e in n.parents]} for n in self.nodes]}


def _edge_dict(edge: Edge) -> dict[str, Any]:
    return {"parent_id": edge.parent_id, "policy": edge.policy,
            "parent_state": edge.parent_state, "resolved_at": edge.resolved_at}


def _time(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.isoformat() if isinstance(value, datetime) else str(value)


async def workflow_graph(db: Conn | asyncpg.Pool, q: Queries, job_id: int,
                         limit: int = GRAPH_LIMIT) -> WorkflowGraph:
    """The graph around ``job_id``; `JobNotFound` if no job or edge has that id."""
    validate.check_id("job_id", job_id)
    with translated():
        rows = await db.fetch(q["dependency_graph"], job_id, limit + 1)
    if len(rows) == 1 and rows[0]["kind"] is None:
        raise JobNotFound(f"job {job_id} not found")
    nodes = [WorkflowNode(r["id"], r["kind"], r["queue"], r["state"], r["attempt"],
                          [Edge(e["parent_id"], e["policy"], e["parent_state"],
                                _time(e["resolved_at"])) for e in r["parents"]])
             for r in rows[:limit]]
    return WorkflowGraph(job_id, nodes, truncated=len(rows) > limit)
