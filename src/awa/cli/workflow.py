"""``awa workflow show``: the jobs connected to one job by dependencies."""

from __future__ import annotations

from typing import Any

import click

from awa.cli.output import emit, json_option, run_with_client, say
from awa.cli.root import main

COLUMNS = ("layer", "id", "kind", "queue", "status", "after", "policy")


@main.group()
def workflow() -> None:
    """Job dependencies and workflows (chain / group / chord)."""


@workflow.command("show")
@click.argument("job_id", type=int)
@json_option
@click.pass_obj
def workflow_show(obj: dict[str, Any], job_id: int, as_json: bool) -> None:
    """Every job connected to JOB_ID by dependencies, layer by layer (a job's layer is
    one more than its deepest parent's). Status ``waiting`` means parked until its
    parents finish; ``after`` lists parents as id:state (``…`` while running)."""
    graph = run_with_client(obj, lambda c: c.workflow(job_id))
    if as_json:
        emit(graph.as_dict(), True)
        return
    rows = []
    for depth, layer in enumerate(graph.layers()):
        for n in layer:
            rows.append({
                "layer": depth, "id": n.id, "kind": n.kind, "queue": n.queue,
                "status": n.status,
                "after": " ".join(f"{e.parent_id}:{e.parent_state or '…'}" for e in n.parents),
                "policy": n.parents[0].policy if n.parents else ""})
    emit(rows, False, COLUMNS, title=f"workflow of job {job_id}")
    if graph.truncated:
        say(f"(only the first {len(graph.nodes)} jobs are shown)")
