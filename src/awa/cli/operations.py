"""``awa queue ...``, ``awa dlq ...``, ``awa cron ...`` and ``awa health``."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import click

import awa
from awa.admin import bulk
from awa.admin import jobs as admin
from awa.cli.output import (
    JOB_COLUMNS,
    confirm,
    current_format,
    emit,
    emit_job,
    fail,
    first_line,
    full_option,
    json_option,
    plain,
    run_with_client,
    say,
    yes_option,
)
from awa.cli.progress import checked_action, chunk_option, run_bulk
from awa.cli.root import main
from awa.core import states
from awa.core.errors import SchemaNotMigrated
from awa.worker.config import parse_addr


@main.group()
def queue() -> None:
    """Queue statistics and switches."""


@queue.command("stats")
@full_option
@json_option
@click.pass_obj
def queue_stats(obj: dict[str, Any], full: bool, as_json: bool) -> None:
    """Counts per state, completions in the last hour, lag and pause, per queue."""
    stats: Any = run_with_client(obj, lambda c: c.queue_stats())
    if not as_json:  # people read seconds to a tenth; --json keeps the exact value
        stats = [{**row, "lag_seconds": None if row["lag_seconds"] is None
                  else f"{row['lag_seconds']:.1f}"} for row in plain(stats)]
    emit(stats, as_json, ("queue", "available", "scheduled", "retryable", "running",
                          "waiting_external", "failed", "completed_last_hour", "lag_seconds",
                          "paused"), title="queues", full=full)


@queue.command("keys")
@click.option("--queue", "queue_name", default=None, help="Only this queue's keys.")
@click.option("--limit", type=click.IntRange(1, states.KEY_STATS_LIMIT_MAX),
              default=states.KEY_STATS_LIMIT_DEFAULT, show_default=True,
              help="List at most this many keys (saturated ones first).")
@full_option
@json_option
@click.pass_obj
def queue_keys(obj: dict[str, Any], queue_name: str | None, limit: int, full: bool,
               as_json: bool) -> None:
    """Concurrency keys with jobs in flight: limit, in flight, waiting; saturated first."""
    stats = run_with_client(obj, lambda c: c.concurrency_keys(queue_name, limit))
    emit(stats, as_json, ("queue", "key", "saturated", "in_flight", "max_in_flight", "running",
                          "waiting", "waiting_at_least"), title="concurrency keys", full=full)


@queue.command("depth")
@click.argument("name")
@click.option("--cap", type=int, default=states.DEPTH_SIGNAL_CAP, show_default=True,
              help="Count no further than this (the count reads one index entry per job).")
@json_option
@click.pass_obj
def queue_depth(obj: dict[str, Any], name: str, cap: int, as_json: bool) -> None:
    """Available (due, unclaimed) jobs of a queue: the depth backpressure reads."""
    depth = run_with_client(obj, lambda c: c.queue_depth(name, cap=cap))
    if as_json:
        click.echo(json.dumps({"queue": depth.queue, "depth": depth.depth, "cap": depth.cap,
                               "at_least": depth.at_least}))
    else:
        say(f"{depth.queue}: {'>= ' if depth.at_least else ''}{depth.depth} available")


create_option = click.option(
    "--create", is_flag=True,
    help="Act even if nothing knows the queue yet (no jobs, workers, overrides or schedules).")


def require_queue(obj: dict[str, Any], name: str, verb: str) -> None:
    """Exit 1 unless queue ``name`` exists (a typo must not create a queue)."""
    async def known(c: awa.AsyncClient) -> bool:
        return await admin.queue_known(await c.pool(), c._q, name)
    if not run_with_client(obj, known):
        fail(f"queue {name!r} does not exist (no jobs, workers, overrides or schedules use "
             f"it); pass --create to {verb} it anyway")


@queue.command("pause")
@click.argument("name")
@click.option("--by", "paused_by", default=None, help="Who is pausing (recorded).")
@create_option
@yes_option
@click.pass_obj
def queue_pause(obj: dict[str, Any], name: str, paused_by: str | None, create: bool,
                yes: bool) -> None:
    """Stop workers claiming from a queue (inserts still succeed)."""
    if not create:
        require_queue(obj, name, "pause")
    run_with_client(obj, lambda c: c.pause_queue(name, paused_by))
    say(f"paused {name}")


@queue.command("resume")
@click.argument("name")
@yes_option
@click.pass_obj
def queue_resume(obj: dict[str, Any], name: str, yes: bool) -> None:
    """Let workers claim from a queue again."""
    run_with_client(obj, lambda c: c.resume_queue(name))
    say(f"resumed {name}")


@queue.command("drain")
@click.argument("name")
@yes_option
@click.pass_obj
def queue_drain(obj: dict[str, Any], name: str, yes: bool) -> None:
    """Cancel every job of a queue that is waiting to run."""
    confirm(yes, f"Cancel every waiting job of queue {name}?")
    say(f"cancelled {run_with_client(obj, lambda c: c.drain_queue(name))} jobs")


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
@full_option
@json_option
@click.pass_obj
def dlq_list(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
             before_id: int | None, limit: int, full: bool, as_json: bool) -> None:
    """Dead-lettered jobs, newest first."""
    entries = run_with_client(obj, lambda c: c.list_dlq(kind=kind, queue=queue, tag=tag,
                                                        before_id=before_id, limit=limit))
    rows = [{**e.job.to_dict(), "reason": e.reason, "dlq_at": e.dlq_at} for e in entries]
    emit(rows, as_json, (*JOB_COLUMNS[:4], "attempt", "reason", "dlq_at"), title="dlq",
         full=full)


@dlq.command("depth")
@click.option("--queue", default=None)
@json_option
@click.pass_obj
def dlq_depth(obj: dict[str, Any], queue: str | None, as_json: bool) -> None:
    """How many jobs are dead-lettered, per queue."""
    if queue is not None:  # validated like every queue name
        by_queue = {queue: run_with_client(obj, lambda c: c.dlq_depth(queue=queue))}
    else:
        by_queue = run_with_client(obj, lambda c: c.dlq_depth_by_queue())
    if not by_queue and not as_json and current_format() != "tsv":
        say("the dead letter queue is empty")
        return
    emit(by_queue, as_json)


@dlq.command("retry")
@click.argument("job_id", type=int)
@click.option("--queue", default=None)
@click.option("--priority", type=int, default=None)
@yes_option
@full_option
@json_option
@click.pass_obj
def dlq_retry(obj: dict[str, Any], job_id: int, queue: str | None, priority: int | None,
              yes: bool, full: bool, as_json: bool) -> None:
    """Re-enqueue one dead-lettered job."""
    confirm(yes, f"Retry dead-lettered job {job_id}?")
    job = run_with_client(obj, lambda c: c.retry_from_dlq(job_id, queue=queue,
                                                          priority=priority))
    if job is None:
        fail(f"job {job_id} is not in the dead letter queue")
    emit_job(job, as_json, full)


@dlq.command("retry-bulk")
@_filters
@click.option("--all", "allow_all", is_flag=True, help="Allow no filter.")
@chunk_option
@yes_option
@json_option
@click.pass_obj
def dlq_retry_bulk(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
                   allow_all: bool, chunk_size: int, yes: bool, as_json: bool) -> None:
    """Re-enqueue every matching dead-lettered job, a chunk per transaction."""
    _need_filter("dlq retry-bulk", allow_all, kind, queue, tag)
    action = checked_action(lambda: bulk.retry_dlq(kind=kind, queue=queue, tag=tag,
                                                   allow_all=allow_all))
    run_bulk(obj, action, verb="retried", doing="retrying",
             prompt="Retry {n} dead-lettered jobs?", yes=yes, chunk_size=chunk_size,
             as_json=as_json)


#: awa-pg's name for ``retry-bulk``.
dlq.add_command(dlq_retry_bulk, name="retry-all")


def _need_filter(command: str, allow_all: bool, *filters: str | None) -> None:
    if not allow_all and all(f is None for f in filters):
        fail(f"{command} needs --kind, --queue or --tag (or --all for every job)")


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
    say(f"moved {job_id}")


@dlq.command("purge")
@_filters
@click.option("--id", "job_id", type=int, default=None, help="Purge only this job.")
@click.option("--all", "allow_all", is_flag=True, help="Allow no filter.")
@chunk_option
@yes_option
@json_option
@click.pass_obj
def dlq_purge(obj: dict[str, Any], kind: str | None, queue: str | None, tag: str | None,
              job_id: int | None, allow_all: bool, chunk_size: int, yes: bool,
              as_json: bool) -> None:
    """Delete dead-lettered jobs for good, a chunk per transaction."""
    if job_id is not None:
        confirm(yes, f"Delete dead-lettered job {job_id} for good?")
        n = int(run_with_client(obj, lambda c: c.purge_dlq_job(job_id)))
        emit({"purged": n} if as_json else f"purged {n} jobs", as_json)
        return
    _need_filter("dlq purge", allow_all, kind, queue, tag)
    action = checked_action(lambda: bulk.purge_dlq(kind=kind, queue=queue, tag=tag,
                                                   allow_all=allow_all))
    run_bulk(obj, action, verb="purged", doing="purging",
             prompt="Delete {n} dead-lettered jobs for good?", yes=yes,
             chunk_size=chunk_size, as_json=as_json)


@main.group()
def storage() -> None:
    """Storage status, and where plain jobs are enqueued (docs/storage.md)."""


@storage.command("ring")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.pass_obj
def storage_ring(obj: dict[str, Any], state: str) -> None:
    """Enqueue plain jobs into the append-only lane (on; a new database's default) or
    into awa.jobs (off). In an upgraded database, switch it on once every worker
    runs this release."""
    run_with_client(obj, lambda c: c.set_ring_enqueue(state == "on"))
    click.echo(f"plain jobs are enqueued into {'the ring' if state == 'on' else 'awa.jobs'}")


@storage.command("status")
@click.pass_obj
def storage_status(obj: dict[str, Any]) -> None:
    """The schema's storage as JSON: version, active jobs, finished partitions."""
    click.echo(run_with_client(obj, lambda c: c.storage_status()))


@main.group()
def cron() -> None:
    """Cron schedules."""


@cron.command("list")
@full_option
@json_option
@click.pass_obj
def cron_list(obj: dict[str, Any], full: bool, as_json: bool) -> None:
    """Every schedule, with its next fire time (and why not, for one that cannot fire)."""
    rows = run_with_client(obj, lambda c: c.list_cron_jobs())
    columns: tuple[str, ...] = ("name", "cron_expr", "timezone", "kind", "queue", "paused",
                                "last_fire_at", "next_fire_at")
    if any(r.get("error") for r in rows):
        columns += ("error",)
    emit(rows, as_json, columns, title="cron", full=full)


_CRON_ACTIONS = {
    "pause": ("pause_cron_job", "Stop schedule NAME firing until it is resumed."),
    "resume": ("resume_cron_job", "Let schedule NAME fire again. Fires missed while it was "
                                  "paused are not made up."),
    "trigger": ("trigger_cron_job", "Enqueue schedule NAME's job now, outside its timetable."),
    "remove": ("delete_cron_job", "Delete schedule NAME. A worker whose code still declares "
                                  "it adds it back when it starts."),
}


def _cron_action(verb: str, method: str, summary: str) -> None:
    @cron.command(verb, help=summary)
    @click.argument("name")
    @yes_option
    @click.pass_obj
    def command(obj: dict[str, Any], name: str, yes: bool) -> None:
        result = run_with_client(obj, lambda c: getattr(c, method)(name))
        if result is False:
            fail(f"no cron schedule named {name!r}")
        say(f"{verb}: {name}")


for _verb, (_method, _summary) in _CRON_ACTIONS.items():
    _cron_action(_verb, _method, _summary)


@main.command()
@click.option("--addr", envvar="AWA_HEALTH_ADDR", default=None, metavar="HOST:PORT",
              help="Ask a running worker's health listener (/readyz) instead of checking "
                   "the database (default: $AWA_HEALTH_ADDR).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for an answer.")
@json_option
@click.pass_obj
def health(obj: dict[str, Any], addr: str | None, timeout: float, as_json: bool) -> None:
    """Exit 0 when healthy, else 1: a worker's /readyz with --addr, else database and schema."""
    if addr:
        _worker_ready(addr, timeout, as_json)
        return

    async def check() -> int:
        async with awa.AsyncClient(obj["url"], max_connections=1, schema=obj["schema"]) as c:
            version = await c.check_schema()
            try:  # what every worker's claim and every dashboard reads must work too
                await c.queue_stats()
            except Exception as exc:
                fail(f"queue statistics fail: {first_line(exc)}")
            return version
    try:
        version = asyncio.run(asyncio.wait_for(check(), timeout))
    except TimeoutError:
        fail(f"database did not answer within {timeout:g}s")
    except SchemaNotMigrated as exc:
        fail(first_line(exc))
    except Exception as exc:  # a probe reports every failure as one line, never a traceback
        fail(f"database unreachable: {first_line(exc)}")
    emit({"healthy": True, "postgres_connected": True, "schema_version": version}, as_json)


def _readyz_url(addr: str) -> str:
    """The /readyz URL for ``host:port`` (a wildcard bind address means this machine)."""
    if addr.startswith(("http://", "https://")):
        return addr.rstrip("/") + "/readyz"
    host, port = parse_addr(addr)
    host = host.strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/readyz"


def _fetch_readiness(url: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """GET ``url`` directly (no proxy): the HTTP status and the JSON object it answered."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        raise ValueError(f"{url} answered HTTP {status} without a health payload")
    return status, payload


def _worker_ready(addr: str, timeout: float, as_json: bool) -> None:
    try:
        url = _readyz_url(addr)
    except ValueError as exc:
        fail(str(exc))
    try:
        status, payload = _fetch_readiness(url, timeout)
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:  # refused, unknown host, timed out (URLError is an OSError)
        reason = getattr(exc, "reason", None) or exc
        fail(f"cannot reach the health listener at {addr}: {reason}")
    failing = [k for k, v in payload.items()
               if (k == "shutting_down" and v is True)
               or (k not in ("ready", "shutting_down") and v is False)]
    if as_json:
        emit(payload, True)
    else:
        rows = [{"check": k, "value": v, "ok": "FAIL" if k in failing else "ok"}
                for k, v in payload.items() if k != "ready"]
        emit(rows, False, ("check", "value", "ok"),
             title=f"worker {addr}: {'ready' if status == 200 else 'not ready'}")
    if status != 200 or payload.get("ready") is not True:
        fail(f"worker at {addr} is not ready (HTTP {status}): "
             f"{', '.join(failing) or 'no failing check named'}")
