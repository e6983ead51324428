"""``awa job ...`` and ``awa enqueue``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from awa.cli import main
from awa.cli.output import JOB_COLUMNS, confirm, emit, fail, run_with_client

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
yes_option = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")


@main.group()
def job() -> None:
    """Inspect and act on jobs."""


@job.command("list")
@click.option("--state", default=None)
@click.option("--kind", default=None)
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True)
@json_option
@click.pass_obj
def job_list(obj: dict[str, Any], state: str | None, kind: str | None, queue: str | None,
             limit: int, as_json: bool) -> None:
    """Jobs, newest first."""
    jobs = run_with_client(obj, lambda c: c.list_jobs(state=state, kind=kind, queue=queue,
                                                      limit=limit))
    emit(jobs, as_json, JOB_COLUMNS, title="jobs")


@job.command("dump")
@click.argument("job_id", type=int)
@click.pass_obj
def job_dump(obj: dict[str, Any], job_id: int) -> None:
    """Every field of one job, as JSON."""
    click.echo(run_with_client(obj, lambda c: c.dump_job(job_id)))


@job.command("dump-run")
@click.argument("job_id", type=int)
@click.option("--attempt", type=int, default=None)
@click.pass_obj
def job_dump_run(obj: dict[str, Any], job_id: int, attempt: int | None) -> None:
    """One attempt of a job (default: the latest), as JSON."""
    click.echo(run_with_client(obj, lambda c: c.dump_run(job_id, attempt)))


@job.command("retry")
@click.argument("job_id", type=int)
@yes_option
@json_option
@click.pass_obj
def job_retry(obj: dict[str, Any], job_id: int, yes: bool, as_json: bool) -> None:
    """Send a failed, cancelled or waiting job back to available."""
    confirm(yes, f"Retry job {job_id}?")
    emit(run_with_client(obj, lambda c: c.retry(job_id)), as_json)


@job.command("cancel")
@click.argument("job_id", type=int)
@yes_option
@json_option
@click.pass_obj
def job_cancel(obj: dict[str, Any], job_id: int, yes: bool, as_json: bool) -> None:
    """Cancel an unfinished job (a running handler is told)."""
    confirm(yes, f"Cancel job {job_id}?")
    cancelled = run_with_client(obj, lambda c: c.cancel(job_id))
    if cancelled is None:
        fail(f"job {job_id} had already finished")
    emit(cancelled, as_json)


@job.command("retry-failed")
@click.option("--kind", default=None)
@click.option("--queue", default=None)
@yes_option
@json_option
@click.pass_obj
def job_retry_failed(obj: dict[str, Any], kind: str | None, queue: str | None, yes: bool,
                     as_json: bool) -> None:
    """Retry every failed job of one kind or one queue."""
    confirm(yes, f"Retry all failed jobs of {'kind ' + kind if kind else 'queue ' + str(queue)}?")
    result = run_with_client(obj, lambda c: c.retry_failed(kind=kind, queue=queue))
    emit({"retried": result.matched} if not as_json else result, as_json)


@job.command("discard")
@click.option("--kind", required=True)
@yes_option
@json_option
@click.pass_obj
def job_discard(obj: dict[str, Any], kind: str, yes: bool, as_json: bool) -> None:
    """Delete the failed jobs of a kind."""
    confirm(yes, f"Delete all failed jobs of kind {kind}?")
    emit({"discarded": run_with_client(obj, lambda c: c.discard_failed(kind))}, as_json)


@main.command()
@click.argument("kind")
@click.option("--args", "args_json", default="{}", show_default=True, help="JSON object.")
@click.option("--queue", default="default", show_default=True)
@click.option("--priority", default=2, show_default=True)
@click.option("--count", default=1, show_default=True, help="How many copies to enqueue.")
@json_option
@click.pass_obj
def enqueue(obj: dict[str, Any], kind: str, args_json: str, queue: str, priority: int,
            count: int, as_json: bool) -> None:
    """Enqueue ad-hoc jobs of KIND."""
    try:
        args = json.loads(args_json)
    except ValueError as exc:
        fail(f"--args is not JSON: {exc}")
    if not isinstance(args, dict):
        fail("--args must be a JSON object")
    if count < 1:
        fail("--count must be at least 1")

    async def go(c: Any) -> Any:
        if count == 1:
            return await c.insert(args, kind=kind, queue=queue, priority=priority)
        progress: Any = click.progressbar(length=count, label="enqueueing", file=sys.stderr)
        with progress as bar:
            done = 0
            while done < count:
                n = min(5000, count - done)
                await c.enqueue_many_copy([args] * n, kind=kind, queue=queue,
                                          priority=priority)
                done += n
                bar.update(n)
        return {"enqueued": count}
    emit(run_with_client(obj, go), as_json)
