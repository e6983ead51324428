"""Progress bars for long CLI operations, and the chunked bulk actions that drive them.

Bars go to stderr and only when a person watches: stderr is a terminal and
``--json`` is not given, so pipes, scripts and tests get clean output. The
environment variable ``AWA_PROGRESS`` overrides the terminal check:
``AWA_PROGRESS=1`` forces bars (rendered with terminal codes even into a pipe,
which is how the tests see them), ``AWA_PROGRESS=0`` turns them off. The
summary line ("retried 12 jobs") is printed to stdout either way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import click
from rich import progress as rp
from rich.console import Console

import awa
from awa.admin import bulk
from awa.cli.output import confirm, emit, fail, run_with_client
from awa.core.errors import AwaError
from awa.db.queries import queries

chunk_option = click.option("--chunk-size", type=click.IntRange(1, bulk.MAX_CHUNK),
                            default=1000, show_default=True,
                            help="Rows per transaction (one progress step each).")


def bars_enabled(as_json: bool = False) -> bool:
    """Whether to draw bars: never with --json; ``AWA_PROGRESS`` 1/0 forces; else a TTY."""
    if as_json:
        return False
    forced = os.environ.get("AWA_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


def _stderr_console() -> Console:
    forced = os.environ.get("AWA_PROGRESS", "").strip() == "1"
    return Console(stderr=True, force_terminal=True if forced else None)


class Bar:
    """One rich progress bar on stderr, or a no-op with the same calls when bars are off."""

    def __init__(self, description: str, total: int | None = None, *, enabled: bool,
                 console: Console | None = None) -> None:
        self._progress: rp.Progress | None = None
        self._task: rp.TaskID | None = None
        if enabled:
            self._progress = rp.Progress(
                rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                rp.TimeElapsedColumn(), rp.TimeRemainingColumn(),
                console=console or _stderr_console())
            self._task = self._progress.add_task(description, total=total)

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def set_total(self, total: int) -> None:
        """Fix the total once it is known (migrations learn it under the lock)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=total)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)


def chunked(obj: dict[str, Any], description: str, total: int, as_json: bool,
            work: Callable[[awa.AsyncClient, Callable[[int], None]], Awaitable[int]]) -> int:
    """Run chunked ``work`` under a bar; a failure or ^C says how much was already done."""
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        bar.advance(n)

    async def go(c: awa.AsyncClient) -> int:
        try:
            return await work(c, step)
        except (AwaError, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise AwaError(f"{reason} ({done} of {total} done before the failure)") from exc

    try:
        with Bar(description, total, enabled=bars_enabled(as_json)) as bar:
            return run_with_client(obj, go)
    except KeyboardInterrupt:
        fail(f"interrupted ({done} of {total} done; each chunk committed on its own)")


def run_bulk(obj: dict[str, Any], action: bulk.BulkAction, *, verb: str, doing: str,
             prompt: str, yes: bool, chunk_size: int, as_json: bool) -> None:
    """Count what ``action`` matches, confirm, act in chunks under a bar, print the summary."""
    async def count(c: awa.AsyncClient) -> bulk.Scope:
        return await bulk.scope(await c.pool(), queries(c.schema), action)
    within = run_with_client(obj, count)
    done = 0
    if within.total:
        confirm(yes, prompt.format(n=within.total))

        async def work(c: awa.AsyncClient, step: Callable[[int], None]) -> int:
            return await bulk.run(await c.pool(), queries(c.schema), action, within,
                                  chunk_size=chunk_size, on_chunk=step)
        done = chunked(obj, doing, within.total, as_json, work)
    emit({verb: done} if as_json else f"{verb} {done} jobs", as_json)


def checked_action(make: Callable[[], bulk.BulkAction]) -> bulk.BulkAction:
    """Build a bulk action, turning a bad filter into a one-line failure."""
    try:
        return make()
    except ValueError as exc:
        fail(str(exc))
