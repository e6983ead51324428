"""``awa queue ...``, ``awa dlq ...``, ``awa cron ...`` and ``awa health``."""

from __future__ import annotations

from typing import Any

import click

from awa.cli import main
from awa.cli.jobs import json_option, yes_option
from awa.cli.output import JOB_COLUMNS, confirm, emit, fail, run_with_client


@main.group()
def queue() -> None:
    """Queue statistics and switches."""


@queue.command("stats")
@json_option
@click.pass_obj
def queue_stats(obj: dict[str, Any], as_json: bool) -> None:
    """Counts per state, completions in the last hour, lag and pause, per queue."""
    stats = run_with_client(obj, lambda c: c.queue_stats())
    emit(stats, as_json, ("queue", "available", "scheduled", "retryable", "running",
                          "waiting_external", "failed", "completed_last_hour", "lag_seconds",
                          "paused"), title="queues")


@queue.command("pause")
@click.argument("name")
@click.option("--by", "paused_by", default=None, help="Who is pausing (recorded).")
@click.pass_obj
def queue_pause(obj: dict[str, Any], name: str, paused_by: str | None) -> None:
    """Stop workers claiming from a queue (inserts still succeed)."""
    run_with_client(obj, lambda c: c.pause_queue(name, paused_by))
    click.echo(f"paused {name}")


@queue.command("resume")
@click.argument("name")
@click.pass_obj
def queue_resume(obj: dict[str, Any], name: str) -> None:
    """Let workers claim from a queue again."""
    run_with_client(obj, lambda c: c.resume_queue(name))
    click.echo(f"resumed {name}")


@queue.command("drain")
@click.argument("name")
@yes_option
@click.pass_obj
def queue_drain(obj: dict[str, Any], name: str, yes: bool) -> None:
    """Cancel every job of a queue that is waiting to run."""
    confirm(yes, f"Cancel every waiting job of queue {name}?")
    click.echo(f"cancelled {run_with_client(obj, lambda c: c.drain_queue(name))} jobs")


@main.group()
def dlq() -> None:
    """The dead letter queue."""


def _filters(f: Any) -> Any:
    for opt in (click.option("--kind", default=None), click.option("--queue", default=None),
                click.option("--tag", default=None)):
        f = opt(f)
    return f


@dlq.command("list")
@_filters
@click.option("--before-id", type=int, default=None)
@click.option("--limit", default=50, show_default=True)
@json_option
@click.pass_obj
def dlq_list(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
             before_id: int | None, limit: int, as_json: bool) -> None:
    """Dead-lettered jobs, newest first."""
    entries = run_with_client(obj, lambda c: c.list_dlq(kind=kind, queue=queue, tag=tag,
                                                        before_id=before_id, limit=limit))
    rows = [{**e.job.to_dict(), "reason": e.reason, "dlq_at": e.dlq_at} for e in entries]
    emit(rows, as_json, (*JOB_COLUMNS[:4], "attempt", "reason", "dlq_at"), title="dlq")


@dlq.command("depth")
@click.option("--queue", default=None)
@json_option
@click.pass_obj
def dlq_depth(obj: dict[str, Any], queue: str | None, as_json: bool) -> None:
    """How many jobs are dead-lettered, per queue."""
    by_queue = run_with_client(obj, lambda c: c.dlq_depth_by_queue())
    if queue is not None:
        by_queue = {queue: by_queue.get(queue, 0)}
    emit(by_queue, as_json)


@dlq.command("retry")
@click.argument("job_id", type=int)
@click.option("--queue", default=None)
@click.option("--priority", type=int, default=None)
@yes_option
@json_option
@click.pass_obj
def dlq_retry(obj: dict[str, Any], job_id: int, queue: str | None, priority: int | None,
              yes: bool, as_json: bool) -> None:
    """Re-enqueue one dead-lettered job."""
    confirm(yes, f"Retry dead-lettered job {job_id}?")
    job = run_with_client(obj, lambda c: c.retry_from_dlq(job_id, queue=queue,
                                                          priority=priority))
    if job is None:
        fail(f"job {job_id} is not in the dead letter queue")
    emit(job, as_json)


@dlq.command("retry-bulk")
@_filters
@click.option("--all", "allow_all", is_flag=True, help="Allow no filter.")
@yes_option
@click.pass_obj
def dlq_retry_bulk(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
                   allow_all: bool, yes: bool) -> None:
    """Re-enqueue every matching dead-lettered job."""
    confirm(yes, "Retry all matching dead-lettered jobs?")
    n = run_with_client(obj, lambda c: c.bulk_retry_from_dlq(kind=kind, queue=queue, tag=tag,
                                                             allow_all=allow_all))
    click.echo(f"retried {n} jobs")


@dlq.command("move")
@click.argument("job_id", type=int)
@click.option("--reason", default="manual", show_default=True)
@yes_option
@click.pass_obj
def dlq_move(obj: dict[str, Any], job_id: int, reason: str, yes: bool) -> None:
    """Move a failed job into the dead letter queue."""
    confirm(yes, f"Move failed job {job_id} to the dead letter queue?")
    if run_with_client(obj, lambda c: c.move_failed_to_dlq(job_id, reason)) is None:
        fail(f"job {job_id} is not a failed job")
    click.echo(f"moved {job_id}")


@dlq.command("purge")
@_filters
@click.option("--id", "job_id", type=int, default=None, help="Purge only this job.")
@click.option("--all", "allow_all", is_flag=True, help="Allow no filter.")
@yes_option
@click.pass_obj
def dlq_purge(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
              job_id: int | None, allow_all: bool, yes: bool) -> None:
    """Delete dead-lettered jobs."""
    confirm(yes, "Delete the matching dead-lettered jobs for good?")
    if job_id is not None:
        n = int(run_with_client(obj, lambda c: c.purge_dlq_job(job_id)))
    else:
        n = run_with_client(obj, lambda c: c.purge_dlq(kind=kind, queue=queue, tag=tag,
                                                       allow_all=allow_all))
    click.echo(f"purged {n} jobs")


@main.group()
def cron() -> None:
    """Cron schedules."""


@cron.command("list")
@json_option
@click.pass_obj
def cron_list(obj: dict[str, Any], as_json: bool) -> None:
    """Every schedule, with its next fire time."""
    emit(run_with_client(obj, lambda c: c.list_cron_jobs()), as_json,
         ("name", "cron_expr", "timezone", "kind", "queue", "paused", "last_fire_at",
          "next_fire_at"), title="cron")


def _cron_action(verb: str, method: str) -> None:
    @cron.command(verb)
    @click.argument("name")
    @click.pass_obj
    def command(obj: dict[str, Any], name: str) -> None:
        result = run_with_client(obj, lambda c: getattr(c, method)(name))
        if result is False:
            fail(f"no cron schedule named {name!r}")
        click.echo(f"{verb}: {name}")
    command.__doc__ = f"{verb.capitalize()} a schedule."


for _verb, _method in (("pause", "pause_cron_job"), ("resume", "resume_cron_job"),
                       ("trigger", "trigger_cron_job"), ("remove", "delete_cron_job")):
    _cron_action(_verb, _method)


@main.command()
@json_option
@click.pass_obj
def health(obj: dict[str, Any], as_json: bool) -> None:
    """Database reachable and schema up to date: exit 0, else 1."""
    async def check(c: Any) -> dict[str, Any]:
        version = await c.check_schema()
        return {"healthy": True, "postgres_connected": True, "schema_version": version}
    emit(run_with_client(obj, check), as_json)
