"""``awa batch ...``: durable batch operations (set priority, move queue) over queued jobs.

Submitting only records the operation; a running worker's maintenance leader
carries it out in chunks (``awa batch show ID`` follows it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import click

from awa.cli.output import (
    JOB_COLUMNS,
    confirm,
    current_format,
    emit,
    fail,
    full_option,
    json_option,
    run_with_client,
    say,
    yes_option,
)
from awa.cli.root import main
from awa.core.batch_spec import (
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)

OP_COLUMNS = ("id", "state", "change", "progress", "skipped", "errored", "submitted_at")
FILTER_HELP = "--queue, --kind, --tag, --id, --state, --created-after or --created-before"


@main.group()
def batch() -> None:
    """Durable batch operations on queued jobs, run by the maintenance leader."""


def _filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed((
            click.option("--queue", default=None, help="Jobs of this queue."),
            click.option("--kind", default=None, help="Jobs of this kind."),
            click.option("--tag", default=None, help="Jobs with this tag."),
            click.option("--id", "ids", type=int, multiple=True, help="This job (repeatable)."),
            click.option("--state", default=None,
                         help="available, scheduled or retryable (default: all three)."),
            click.option("--created-after", default=None, metavar="ISO",
                         help="Created at or after this time."),
            click.option("--created-before", default=None, metavar="ISO",
                         help="Created before this time."))):
        f = opt(f)
    return f


def _filter(kw: dict[str, Any]) -> BatchOperationFilter:
    f: dict[str, Any] = {"queue": kw.pop("queue"), "kind": kw.pop("kind"), "tag": kw.pop("tag"),
                         "ids": list(kw.pop("ids")) or None, "state": kw.pop("state"),
                         "created_at_gte": kw.pop("created_after"),
                         "created_at_lt": kw.pop("created_before")}
    return cast(BatchOperationFilter, {k: v for k, v in f.items() if v is not None})


def _spec(op_kind: str, target: str, priority: int | None) -> dict[str, Any]:
    if op_kind == "set_priority":
        try:
            return {"priority": int(target)}
        except ValueError:
            fail(f"priority must be an integer, got {target!r}")
    return {"queue": target} if priority is None else {"queue": target, "priority": priority}


def _describe(op_kind: str, spec: dict[str, Any]) -> str:
    if op_kind == "set_priority":
        return f"set priority {spec['priority']} on"
    extra = f" (priority {spec['priority']})" if "priority" in spec else ""
    return f"move to queue {spec['queue']}{extra}"


def _emit_preview(preview: BatchOperationPreview, as_json: bool, full: bool) -> None:
    if as_json:
        emit(preview, True)
        return
    say(f"{preview['total_matched']} queued jobs match; the first {len(preview['sample'])}:",
        err=current_format() == "tsv")  # TSV on stdout stays rows only
    emit(preview["sample"], False, JOB_COLUMNS, title="sample", full=full)


@batch.group("preview")
def preview() -> None:
    """How many queued jobs an operation would change now, and a sample (writes nothing)."""


@preview.command("set-priority")
@click.argument("priority")
@_filter_options
@full_option
@json_option
@click.pass_obj
def preview_set_priority(obj: dict[str, Any], /, priority: str, full: bool, as_json: bool,
                         **kw: Any) -> None:
    """Preview giving matching queued jobs PRIORITY (1 = most urgent, 4)."""
    f, spec = _filter(kw), _spec("set_priority", priority, None)
    _emit_preview(run_with_client(obj, lambda c: c.preview_batch_operation(
        "set_priority", spec=spec, filter=f)), as_json, full)


@preview.command("move-queue")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--priority", type=int, default=None, help="Also set this priority.")
@_filter_options
@full_option
@json_option
@click.pass_obj
def preview_move_queue(obj: dict[str, Any], /, queue_name: str, priority: int | None,
                       full: bool, as_json: bool, **kw: Any) -> None:
    """Preview moving matching queued jobs to QUEUE."""
    f, spec = _filter(kw), _spec("move_queue", queue_name, priority)
    _emit_preview(run_with_client(obj, lambda c: c.preview_batch_operation(
        "move_queue", spec=spec, filter=f)), as_json, full)


def _submit(obj: dict[str, Any], op_kind: BatchOperationKind, spec: dict[str, Any],
            kw: dict[str, Any], allow_all: bool, submitted_by: str | None, yes: bool,
            as_json: bool) -> None:
    f = _filter(kw)
    if not f and not allow_all:
        fail(f"batch {op_kind.replace('_', '-')} needs a filter ({FILTER_HELP}) "
             "or --all for every queued job")
    found = run_with_client(obj, lambda c: c.preview_batch_operation(op_kind, spec=spec,
                                                                     filter=f))
    confirm(yes, f"{_describe(op_kind, spec).capitalize()} {found['total_matched']} queued "
                 "jobs (as they match when the operation runs)?")
    op = run_with_client(obj, lambda c: c.submit_batch_operation(
        op_kind, spec=spec, filter=f, submitted_by=submitted_by, allow_all=allow_all))
    if as_json:
        emit(op, True)
    else:
        say(f"submitted {op['id']}; a worker's maintenance leader runs it "
            f"(awa batch show {op['id']})")


_all_option = click.option("--all", "allow_all", is_flag=True,
                           help="Allow no filter: every queued job.")
_by_option = click.option("--by", "submitted_by", default=None, help="Who submits (recorded).")


@batch.command("set-priority")
@click.argument("priority")
@_filter_options
@_all_option
@_by_option
@yes_option
@json_option
@click.pass_obj
def set_priority(obj: dict[str, Any], /, priority: str, allow_all: bool,
                 submitted_by: str | None, yes: bool, as_json: bool, **kw: Any) -> None:
    """Give matching queued jobs PRIORITY (1 = most urgent, 4)."""
    _submit(obj, "set_priority", _spec("set_priority", priority, None), kw, allow_all,
            submitted_by, yes, as_json)


@batch.command("move-queue")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--priority", type=int, default=None, help="Also set this priority.")
@_filter_options
@_all_option
@_by_option
@yes_option
@json_option
@click.pass_obj
def move_queue(obj: dict[str, Any], /, queue_name: str, priority: int | None, allow_all: bool,
               submitted_by: str | None, yes: bool, as_json: bool, **kw: Any) -> None:
    """Move matching queued jobs to QUEUE (ordered jobs and queue-keyed unique jobs stay)."""
    _submit(obj, "move_queue", _spec("move_queue", queue_name, priority), kw, allow_all,
            submitted_by, yes, as_json)


@batch.command("list")
@click.option("--state", default=None, help="Only operations in this state.")
@click.option("--limit", default=50, show_default=True)
@full_option
@json_option
@click.pass_obj
def list_operations(obj: dict[str, Any], state: str | None, limit: int, full: bool,
                    as_json: bool) -> None:
    """Batch operations, newest first."""
    chosen = cast("BatchOperationState | None", state)
    ops = run_with_client(obj, lambda c: c.list_batch_operations(state=chosen, limit=limit))
    if as_json:
        emit(ops, True)
        return
    rows = [{**op, "change": _change(op["spec"]),
             "progress": f"{op['processed']}/{_or_unknown(op['total_matched'])}"} for op in ops]
    emit(rows, False, OP_COLUMNS, title="batch operations", full=full)


def _or_unknown(n: int | None) -> str:
    return "?" if n is None else str(n)


def _change(spec: dict[str, Any]) -> str:
    if spec.get("op_kind") == "move_queue":
        extra = f", priority {spec['priority']}" if spec.get("priority") is not None else ""
        return f"queue → {spec.get('queue')}{extra}"
    return f"priority → {spec.get('priority')}"


@batch.command("show")
@click.argument("operation_id")
@full_option
@json_option
@click.pass_obj
def show(obj: dict[str, Any], operation_id: str, full: bool, as_json: bool) -> None:
    """One batch operation and its progress."""
    emit(run_with_client(obj, lambda c: c.get_batch_operation(operation_id)), as_json,
         full=full)


@batch.command("cancel")
@click.argument("operation_id")
@yes_option
@json_option
@click.pass_obj
def cancel(obj: dict[str, Any], operation_id: str, yes: bool, as_json: bool) -> None:
    """Cancel a pending operation, or stop a running one after its current chunk."""
    confirm(yes, f"Cancel batch operation {operation_id}?")
    op = run_with_client(obj, lambda c: c.cancel_batch_operation(operation_id))
    emit(op if as_json else f"{op['state']}: {op['id']}", as_json)


@batch.command("purge")
@click.option("--before", required=True, metavar="ISO",
              help="Delete finished operations finalized before this time.")
@click.option("--limit", default=1000, show_default=True)
@yes_option
@json_option
@click.pass_obj
def purge(obj: dict[str, Any], before: str, limit: int, yes: bool, as_json: bool) -> None:
    """Delete finished (completed, cancelled, failed) operations."""
    try:
        when = datetime.fromisoformat(before)
    except ValueError:
        fail(f"--before must be an ISO-8601 time, got {before!r}")
    confirm(yes, f"Delete finished batch operations finalized before {when.isoformat()}?")
    n = run_with_client(obj, lambda c: c.purge_batch_operations(when, limit=limit))
    emit({"purged": n} if as_json else f"purged {n} batch operations", as_json)
