"""How the CLI talks back: rich tables for people, JSON for machines, one-line errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table

import awa
from awa.errors import AwaError

T = TypeVar("T")


def plain(value: Any) -> Any:
    """A JSON-ready copy of ``value`` (jobs, dataclasses, datetimes, enums)."""
    if isinstance(value, awa.Job):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None,
         title: str | None = None) -> None:
    """Print ``data``: JSON, or a table of ``columns`` (rows are dicts), or a line."""
    data = plain(data)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if columns is not None and isinstance(data, list):
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in data:
            table.add_row(*[_cell(row.get(c)) for c in columns])
        Console().print(table)
    elif isinstance(data, dict):
        width = max((len(k) for k in data), default=0)
        for key, value in data.items():
            click.echo(f"{key:<{width}}  {_cell(value)}")
    else:
        click.echo(str(data))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def fail(message: str) -> NoReturn:
    """Exit 1 with a one-line reason on stderr."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def run_with_client(obj: dict[str, Any], fn: Callable[[awa.AsyncClient], Awaitable[T]]) -> T:
    """Open a client on the CLI's database, run ``fn``, close it; errors → exit 1."""
    async def go() -> T:
        async with awa.AsyncClient(obj["url"], max_connections=2, schema=obj["schema"]) as c:
            return await fn(c)
    try:
        return asyncio.run(go())
    except (AwaError, ValueError, TypeError, OSError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def confirm(yes: bool, prompt: str) -> None:
    """Mutations ask first unless ``--yes``; no answer (no terminal) means no."""
    if yes:
        return
    try:
        ok = click.confirm(prompt, default=False)
    except click.Abort:
        ok = False
    if not ok:
        fail("not confirmed (pass --yes to skip the question)")


JOB_COLUMNS = ("id", "kind", "queue", "state", "priority", "attempt", "max_attempts",
               "run_at", "tags")
