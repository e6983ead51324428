"""``awa job ...`` and ``awa enqueue``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

import awa
from awa.admin import bulk
from awa.cli.output import (
    JOB_COLUMNS,
    TOO_DEEP,
    confirm,
    emit,
    emit_document,
    emit_job,
    fail,
    full_option,
    json_option,
    run_with_client,
    yes_option,
)
from awa.cli.progress import checked_action, chunk_option, chunked, run_bulk
from awa.cli.root import main
from awa.core.errors import ValidationError
from awa.core.serialize import NOT_JSON, loads


@main.group()
def job() -> None:
    """Inspect and act on jobs."""


@job.command("list")
@click.option("--state", default=None)
@click.option("--kind", default=None)
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True)
@full_option
@json_option
@click.pass_obj
def job_list(obj: dict[str, Any], state: str | None, kind: str | None, queue: str | None,
             limit: int, full: bool, as_json: bool) -> None:
    """Jobs, newest first."""
    jobs = run_with_client(obj, lambda c: c.list_jobs(state=state, kind=kind, queue=queue,
                                                      limit=limit))
    emit(jobs, as_json, JOB_COLUMNS, title="jobs", full=full)


@job.command("dump")
@click.argument("job_id", type=int)
@full_option
@click.option("--json", "as_json", is_flag=True, help="The exact JSON (implies --full).")
@click.pass_obj
def job_dump(obj: dict[str, Any], job_id: int, full: bool, as_json: bool) -> None:
    """Every field of one job, as JSON (fields over 64 KiB cut short unless --full)."""
    emit_document(run_with_client(obj, lambda c: c.dump_job(job_id)), as_json, full)


@job.command("dump-run")
@click.argument("job_id", type=int)
@click.option("--attempt", type=int, default=None)
@full_option
@click.option("--json", "as_json", is_flag=True, help="The exact JSON (implies --full).")
@click.pass_obj
def job_dump_run(obj: dict[str, Any], job_id: int, attempt: int | None, full: bool,
                 as_json: bool) -> None:
    """One attempt of a job (default: the latest), as JSON (long fields cut unless --full)."""
    emit_document(run_with_client(obj, lambda c: c.dump_run(job_id, attempt)), as_json, full)


@job.command("retry")
@click.argument("job_id", type=int)
@yes_option
@click.option("--full", is_flag=True, help="Show every field of the job, whole.")
@json_option
@click.pass_obj
def job_retry(obj: dict[str, Any], job_id: int, yes: bool, full: bool, as_json: bool) -> None:
    """Send a failed, cancelled or waiting job back to available."""
    confirm(yes, f"Retry job {job_id}?")
    emit_job(run_with_client(obj, lambda c: c.retry(job_id)), as_json, full)


@job.command("cancel")
@click.argument("job_id", type=int)
@yes_option
@click.option("--full", is_flag=True, help="Show every field of the job, whole.")
@json_option
@click.pass_obj
def job_cancel(obj: dict[str, Any], job_id: int, yes: bool, full: bool, as_json: bool) -> None:
    """Cancel an unfinished job (a running handler is told)."""
    confirm(yes, f"Cancel job {job_id}?")
    cancelled = run_with_client(obj, lambda c: c.cancel(job_id))
    if cancelled is None:
        fail(f"job {job_id} had already finished")
    emit_job(cancelled, as_json, full)


@job.command("retry-failed")
@click.option("--kind", default=None)
@click.option("--queue", default=None)
@chunk_option
@yes_option
@json_option
@click.pass_obj
def job_retry_failed(obj: dict[str, Any], kind: str | None, queue: str | None,
                     chunk_size: int, yes: bool, as_json: bool) -> None:
    """Retry every failed job of one kind or one queue, a chunk per transaction."""
    if (kind is None) == (queue is None):
        fail("specify exactly one of --kind or --queue")
    action = checked_action(lambda: bulk.retry_failed(kind=kind, queue=queue))
    what = f"kind {kind}" if kind else f"queue {queue}"
    run_bulk(obj, action, verb="retried", doing="retrying",
             prompt=f"Retry {{n}} failed jobs of {what}?", yes=yes, chunk_size=chunk_size,
             as_json=as_json)


@job.command("discard")
@click.option("--kind", required=True)
@chunk_option
@yes_option
@json_option
@click.pass_obj
def job_discard(obj: dict[str, Any], kind: str, chunk_size: int, yes: bool,
                as_json: bool) -> None:
    """Delete the failed jobs of a kind, a chunk per transaction."""
    action = checked_action(lambda: bulk.discard_failed(kind))
    run_bulk(obj, action, verb="discarded", doing="discarding",
             prompt=f"Delete {{n}} failed jobs of kind {kind}?", yes=yes,
             chunk_size=chunk_size, as_json=as_json)


@main.command()
@click.argument("kind")
@click.option("--args", "args_json", default="{}", show_default=True, help="JSON object.")
@click.option("--queue", default="default", show_default=True)
@click.option("--priority", default=2, show_default=True)
@click.option("--count", default=1, show_default=True, help="How many copies to enqueue.")
@click.option("--chunk-size", type=click.IntRange(1, 100_000), default=5000,
              show_default=True, help="Jobs per COPY (one progress step each).")
@full_option
@json_option
@yes_option
@click.pass_obj
def enqueue(obj: dict[str, Any], kind: str, args_json: str, queue: str, priority: int,
            count: int, chunk_size: int, full: bool, as_json: bool, yes: bool) -> None:
    """Enqueue ad-hoc jobs of KIND (many copies go in by COPY, a chunk at a time)."""
    try:
        args = loads(args_json, "--args")
    except ValidationError as exc:
        fail(f"--args is not JSON: {exc.__cause__}" if exc.rule == NOT_JSON
             else f"--args: {TOO_DEEP}")
    if not isinstance(args, dict):
        fail("--args must be a JSON object")
    if count < 1:
        fail("--count must be at least 1")
    if count == 1:
        emit(run_with_client(obj, lambda c: c.insert(args, kind=kind, queue=queue,
                                                     priority=priority)), as_json, full=full)
        return

    async def work(c: awa.AsyncClient, step: Callable[[int], None]) -> int:
        sent = inserted = 0
        while sent < count:
            n = min(chunk_size, count - sent)
            done = await c.enqueue_many_copy([args] * n, kind=kind, queue=queue,
                                             priority=priority)
            sent, inserted = sent + n, inserted + done
            step(done)
        return inserted
    inserted = chunked(obj, "enqueueing", count, as_json, work)
    emit({"enqueued": inserted} if as_json else f"enqueued {inserted} jobs", as_json)
