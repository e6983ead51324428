"""The root of the ``awa`` command line: the group, ``migrate``, ``grants``, ``worker``.

Global ``--database-url`` defaults to ``$DATABASE_URL``, else the embedded
PostgreSQL. Failures exit non-zero with a one-line reason on stderr.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import json
import logging
import os
import sys
from typing import Any

import click
from click.core import ParameterSource

import awa
from awa.cli.output import (
    TOO_DEEP,
    SafeFormatter,
    SafeGroup,
    fail,
    first_line,
    global_format_option,
    say,
    yes_option,
)
from awa.cli.progress import Bar, bars_enabled
from awa.cli.shutdown import exit_now, stop_on_signals
from awa.core.errors import AwaError, ValidationError
from awa.core.serialize import NOT_JSON, loads
from awa.db import migrations
from awa.db.dsn import check_url, redact
from awa.db.errors import translated


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except RecursionError:
        fail(TOO_DEEP)
    except (AwaError, ValueError, TypeError) as exc:
        fail(redact(first_line(exc)))


@click.group(cls=SafeGroup)
@click.version_option(awa.__version__, "--version", prog_name="awa",
                      message="%(prog)s %(version)s")
@click.option("--database-url", envvar="DATABASE_URL", default=None,
              help="PostgreSQL URL (default: $DATABASE_URL, else the embedded server).")
@click.option("--schema", default="awa", show_default=True, help="Schema holding Awa's tables.")
@global_format_option
@click.pass_context
def main(ctx: click.Context, database_url: str | None, schema: str) -> None:
    """Awa job queue CLI: a Postgres-native job queue."""
    if database_url is not None:
        from_env = ctx.get_parameter_source("database_url") is ParameterSource.ENVIRONMENT
        try:
            check_url(database_url, "$DATABASE_URL" if from_env else "--database-url")
        except AwaError as exc:
            fail(str(exc))
    ctx.obj = {"url": database_url, "schema": schema}


@main.command()
@click.option("--sql", "print_sql", is_flag=True, help="Print the migration SQL instead.")
@click.option("--version", "only", type=int, default=None,
              help="Print one migration's SQL (no database needed).")
@click.option("--from", "from_version", type=int, default=None,
              help="Print the SQL of the migrations after this version (exclusive).")
@click.option("--to", "to_version", type=int, default=None,
              help="... up to this version (inclusive; default: the newest).")
@yes_option
@click.pass_obj
def migrate(obj: dict[str, Any], print_sql: bool, only: int | None, from_version: int | None,
            to_version: int | None, yes: bool) -> None:
    """Apply pending schema migrations (safe to run from many processes)."""
    if only is not None or from_version is not None or to_version is not None:
        _print_migrations(obj["schema"], only, from_version, to_version)
        return
    if print_sql:
        for version, description, sql in migrations.pending_sql(0, obj["schema"]):
            click.echo(f"-- {version:04d} {description}\n{sql}")
        return

    def step(done: int, total: int) -> None:
        bar.set_total(total)
        if done:
            bar.advance()

    async def go() -> list[int]:
        async with awa.AsyncClient(obj["url"], max_connections=1, schema=obj["schema"]) as c:
            pool = await c.pool()
            with translated():
                async with pool.acquire() as conn:  # one transaction, one advisory lock
                    return await migrations.apply(conn, c.schema, progress=step)
    with Bar("migrating", enabled=bars_enabled()) as bar:
        applied = _run(go())
    say(f"applied migrations {applied}" if applied else "schema is up to date")


def _print_migrations(schema: str, only: int | None, after: int | None,
                      upto: int | None) -> None:
    """The SQL of one migration or a range, as ``-- Migration V<n>: <description>``."""
    newest = migrations.current_migration_version()
    if only is not None:
        if not 1 <= only <= newest:
            click.echo(f"error: version {only} is out of range 1..{newest}", err=True)
            sys.exit(1)
        after, upto = only - 1, only
    chosen = migrations.migrations_range(after or 0, newest if upto is None else upto)
    if not chosen:
        click.echo(f"no migrations in ({after or 0}, {upto}]", err=True)
    for version, description, _ in chosen:
        sql = next(s for v, _, s in migrations.pending_sql(version - 1, schema) if v == version)
        click.echo(f"-- Migration V{version}: {description}\n{sql}")


@main.command()
@click.argument("role")
@click.option("--read-only", is_flag=True, help="SELECT only (a read-only web UI).")
@click.pass_obj
def grants(obj: dict[str, Any], role: str, read_only: bool) -> None:
    """Print the GRANTs for ROLE (runtime, or --read-only); run them as the owner."""
    from awa.db.roles import grants_sql

    try:
        sql = grants_sql(role, read_only=read_only, schema=obj["schema"])
    except AwaError as exc:
        fail(first_line(exc))
    click.echo(sql, nl=False)  # role and schema are validated identifiers


def _parse_value(key: str, text: str) -> Any:
    try:
        return loads(text, "--set")
    except ValidationError as exc:
        if exc.rule == NOT_JSON:
            return text
        fail(f"--set {key}: {TOO_DEEP}")


def _load_client(target: str) -> awa.AsyncClient:
    """Import ``module:attribute`` and return the `AsyncClient` it names."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected MODULE:CLIENT", param_hint="target")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {first_line(exc)}",
                                 param_hint="target") from None
    if not hasattr(module, attr):
        near = difflib.get_close_matches(attr, [n for n in dir(module)
                                                if isinstance(getattr(module, n, None),
                                                              awa.AsyncClient)], n=1)
        hint = f" (did you mean {module_name}:{near[0]}?)" if near else ""
        raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}{hint}",
                                 param_hint="target")
    client = getattr(module, attr)
    if not isinstance(client, awa.AsyncClient):
        raise click.BadParameter(f"{target!r} is a {type(client).__name__}, not an "
                                 "awa.AsyncClient", param_hint="target")
    return client


def _served(client: awa.AsyncClient) -> str:
    """``shipping (10 workers), mail (4 workers)``: what a started worker serves."""
    runtime = client._runtime
    if runtime is None:
        return "no queues"
    return ", ".join(f"{q.name} ({q.max_workers} workers)" if runtime.config.global_max_workers
                     is None else f"{q.name} (weight {q.weight}, min {q.min_workers})"
                     for q in runtime.config.queues)


@main.command()
@click.argument("target")
@click.option("--queue", "queues", multiple=True, metavar="NAME=N",
              help="Serve queue NAME with N workers (repeatable; default: every task's queue).")
@click.option("--set", "options", multiple=True, metavar="KEY=VALUE",
              help="A start() option, e.g. --set poll_interval_ms=100 (repeatable).")
@click.option("--shutdown-timeout-ms", default=5000, show_default=True)
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Job retries and rescues log at WARNING, failures at ERROR (logger awa.jobs).")
@click.option("--log-format", default="text", show_default=True,
              type=click.Choice(["text", "json"]), help="json: one object per line.")
def worker(target: str, queues: tuple[str, ...], options: tuple[str, ...],
           shutdown_timeout_ms: int, log_level: str, log_format: str) -> None:
    """Run a worker process for the client at MODULE:CLIENT until SIGTERM/SIGINT.

    \b
    A handler gets 5 minutes per attempt by default; past that the attempt is
    rescued as "hard deadline exceeded" and retried. Change it per queue with
    deadline_duration_ms in the queue's start() config (0 turns it off), or live
    with: awa queue overrides set NAME --deadline-ms 3600000.
    """
    configure_logging(log_level, log_format)
    sys.path.insert(0, ".")
    client = _load_client(target)
    queue_list = None
    if queues:
        queue_list = []
        for spec in queues:
            name, _, n = spec.rpartition("=")
            if not name or not n.isdigit():
                raise click.BadParameter(f"{spec!r} is not NAME=N", param_hint="--queue")
            queue_list.append((name, int(n)))
    start_options: dict[str, Any] = {}
    for spec in options:
        key, sep, value = spec.partition("=")
        if not sep:
            raise click.BadParameter(f"{spec!r} is not KEY=VALUE", param_hint="--set")
        start_options[key] = _parse_value(key, value)

    log = logging.getLogger("awa.worker")

    async def go() -> int:
        stop = asyncio.Event()
        stop_on_signals(stop, log, "jobs still running are retried after rescue")
        await client.start(queue_list, **start_options)
        log.info("worker started (pid %s) serving queues: %s", _pid(), _served(client))
        await stop.wait()
        log.info("shutting down")
        runtime = client.runtime
        await client.shutdown(timeout_ms=shutdown_timeout_ms)
        await client.close()
        return runtime.handlers_in_threads() if runtime is not None else 0
    left = _run(go())
    if left:
        # Outcomes of handlers that finished in time are written; these did not,
        # and a thread cannot be stopped: exit instead of waiting for them.
        log.warning("exiting with %d sync handlers still running past the shutdown "
                    "timeout; rescue will retry their jobs", left)
        exit_now(0)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and job fields."""

    FIELDS = ("job_id", "kind", "queue", "attempt")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self.formatTime(record), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        out.update({k: getattr(record, k) for k in self.FIELDS if hasattr(record, k)})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """The worker's root logging: ``level`` and ``text`` or ``json`` lines on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else SafeFormatter(  # escaped text
        "%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def _pid() -> int:
    return os.getpid()
