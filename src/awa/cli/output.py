"""How the CLI talks back: rich tables for people, JSON for machines, one-line errors.

Everything printed for people goes through this module, which makes data from
the database safe for a terminal: control characters (C0, DEL, C1), bidi
overrides and isolates and line separators are shown as escapes (``\\x1b``,
``\\n``, ``\\u202e``), rich markup in data is printed literally, and long
values are cut short with a marker unless ``--full`` is given. ``--json`` output
is exact (``json.dumps``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

import awa
from awa.core.errors import AwaError

T = TypeVar("T")

#: Longest text shown in a table cell (escaped characters count as shown).
CELL_LIMIT = 200
#: Longest value shown in key/value output and ``job dump`` (per field).
VALUE_LIMIT = 64 * 1024
#: The one-line error for input or stored JSON nested deeper than Python can follow.
TOO_DEEP = "a value is nested too deeply (JSON arrays and objects inside each other)"

_BIDI_AND_SEPARATORS = (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
                        *range(0x2066, 0x206A))
#: Characters a terminal could act on, or that reorder or break a line, and how they show.
_ESCAPES: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r",
    **{c: f"\\u{c:04x}" for c in _BIDI_AND_SEPARATORS},
}
#: Escapes in a TSV field: the same, and a backslash doubled.
_TSV_ESCAPES: dict[int, str] = {**_ESCAPES, ord("\\"): "\\\\"}
#: The same characters, except C0 (which ``json.dumps`` escapes), as JSON escapes.
_JSON_ESCAPES: dict[int, str] = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0),
                                                              *_BIDI_AND_SEPARATORS)}

#: Every command that changes something takes it (one that asks nothing ignores it).
yes_option = click.option("--yes", is_flag=True, help="Do not ask for confirmation "
                          "(accepted by every command that changes something).")
full_option = click.option("--full", is_flag=True,
                           help="Show long values whole instead of cut short.")

#: How tables come out: rich tables, tab-separated lines, or exact JSON (``--json``).
FORMATS = ("table", "tsv", "json")
_FORMAT = "awa.format"  # click's ctx.meta keys (shared by every context of one run)
_GLOBAL_FORMAT = "awa.global_format"
#: The width tables get when stdout is not a terminal: wide enough never to cut a column.
PIPE_WIDTH = 1 << 20


def _command_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    if ctx.params.get("as_json") and value != "json":
        raise click.UsageError(f"--json and --format {value} contradict each other", ctx)
    ctx.meta[_FORMAT] = value


def _global_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_GLOBAL_FORMAT] = value


def _json_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    chosen = ctx.meta.get(_FORMAT)
    if value and chosen not in (None, "json"):
        raise click.UsageError(f"--json and --format {chosen} contradict each other", ctx)
    return value or (chosen or ctx.meta.get(_GLOBAL_FORMAT)) == "json"


_FORMAT_HELP = ("table (the default; never cut to the screen when piped), tsv (a header line, "
                "then one tab-separated line per row; tabs, line breaks and backslashes "
                "escaped) or json (as --json).")
global_format_option = click.option(
    "--format", type=click.Choice(FORMATS), default=None, expose_value=False,
    callback=_global_format, help=f"Output of every command: {_FORMAT_HELP}")


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` and ``--format table|tsv|json`` (``as_json`` is True for either JSON)."""
    f = click.option("--format", type=click.Choice(FORMATS), default=None, expose_value=False,
                     callback=_command_format, help=f"Output: {_FORMAT_HELP}")(f)
    return click.option("--json", "as_json", is_flag=True, callback=_json_flag,
                        help="Machine-readable output (exact JSON).")(f)


def current_format() -> str:
    """The chosen output format of this run: ``table``, ``tsv`` or ``json``."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return "table"
    return str(ctx.meta.get(_FORMAT) or ctx.meta.get(_GLOBAL_FORMAT) or "table")


def _printable(text: str) -> str:
    """``text`` with every control, bidi and line-separator character shown as an escape."""
    return text.translate(_ESCAPES)


def _clip(text: str, limit: int | None, escapes: dict[int, str] = _ESCAPES) -> str:
    """``_printable(text)``, cut to ``limit`` shown characters with a marker (None: whole)."""
    if limit is None:
        return text.translate(escapes)
    if len(text) <= limit:
        shown = text.translate(escapes)
        if len(shown) <= limit:
            return shown
    pieces: list[str] = []
    used = 0
    for i, ch in enumerate(text):
        piece = escapes.get(ord(ch), ch)
        if used + len(piece) > limit:
            rest = len(text[i:].encode("utf-8", "surrogatepass"))
            return "".join(pieces) + f"… (+{rest} bytes, use --full)"
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces)


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


def _tsv_field(text: str, limit: int | None) -> str:
    """One TSV field: escaped and cut like a table cell, backslashes doubled (so ``\\t``
    is always an escaped tab)."""
    return _clip(text, limit, _TSV_ESCAPES)


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None,
         title: str | None = None, *, full: bool = False) -> None:
    """Print ``data``: exact JSON, or a table (or TSV) of ``columns`` (rows are dicts), or
    key/value lines, or a line; human output is escaped and long values cut unless ``full``."""
    data = plain(data)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    tsv = current_format() == "tsv"
    if columns is not None and isinstance(data, list):
        limit = None if full else CELL_LIMIT
        if tsv:
            click.echo("\t".join(_tsv_field(c, None) for c in columns))
            for row in data:
                click.echo("\t".join(_tsv_field(_cell(row.get(c)), limit) for c in columns))
            return
        table = Table(title=Text(_printable(title)) if title else None)
        for column in columns:  # a narrow terminal folds a header, never cuts it to "avai…"
            table.add_column(Text(_printable(column), overflow="fold"))
        for row in data:
            table.add_row(*[Text(_clip(_cell(row.get(c)), limit), overflow="fold")
                            for c in columns])
        console = Console()
        if not console.is_terminal:  # piped: as wide as the table needs, nothing cut
            console = Console(width=PIPE_WIDTH)
        console.print(table)
    elif isinstance(data, dict):
        limit = None if full else VALUE_LIMIT
        if tsv:
            for key, value in data.items():
                click.echo(f"{_tsv_field(key, None)}\t{_tsv_field(_cell(value), limit)}")
            return
        keys = {key: _printable(key) for key in data}
        width = max((len(k) for k in keys.values()), default=0)
        for key, value in data.items():
            click.echo(f"{keys[key]:<{width}}  {_clip(_cell(value), limit)}")
    else:
        say(str(data))


#: What `emit_job` shows of a job a command acted on (``--full`` shows every field).
JOB_SUMMARY = ("id", "kind", "queue", "state", "attempt", "max_attempts", "run_at")


def emit_job(job: Any, as_json: bool, full: bool) -> None:
    """A job a command acted on: its summary and where the rest is (``awa job dump``);
    every field with ``full``; the exact row with ``as_json``."""
    if as_json or full:
        emit(job, as_json, full=full)
        return
    row = plain(job)
    summary = {k: row.get(k) for k in JOB_SUMMARY}
    summary["details"] = f"awa job dump {row.get('id')}"
    emit(summary, False)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def emit_document(text: str, as_json: bool, full: bool) -> None:
    """Print a JSON document the library built (``job dump``): exact with ``as_json``, else
    still valid JSON with unsafe characters escaped and fields over 64 KiB cut unless ``full``."""
    if as_json:
        click.echo(text)
        return
    doc = json.loads(text)
    if isinstance(doc, dict) and not full and len(text) > VALUE_LIMIT:
        for key, value in doc.items():
            flat = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if len(flat) > VALUE_LIMIT:
                rest = len(flat[VALUE_LIMIT:].encode("utf-8", "surrogatepass"))
                doc[key] = f"{flat[:VALUE_LIMIT]}… (+{rest} bytes, use --full)"
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False).translate(_JSON_ESCAPES))


def say(message: str, *, err: bool = False) -> None:
    """Print a one-line message (to stderr with ``err``), control characters escaped."""
    click.echo(_printable(message), err=err)


def fail(message: str) -> NoReturn:
    """Exit 1 with a one-line reason on stderr."""
    say(f"error: {message}", err=True)
    sys.exit(1)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type's name."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def run_with_client(obj: dict[str, Any], fn: Callable[[awa.AsyncClient], Awaitable[T]]) -> T:
    """Open a client on the CLI's database, run ``fn``, close it; errors → exit 1."""
    async def go() -> T:
        async with awa.AsyncClient(obj["url"], max_connections=2, schema=obj["schema"]) as c:
            return await fn(c)
    try:
        return asyncio.run(go())
    except RecursionError:
        fail(TOO_DEEP)
    except (AwaError, ValueError, TypeError, OSError) as exc:
        fail(first_line(exc))


def confirm(yes: bool, prompt: str) -> None:
    """Mutations ask first unless ``--yes``; no answer (no terminal) means no."""
    if yes:
        return
    try:
        ok = click.confirm(_printable(prompt), default=False)
    except click.Abort:
        ok = False
    if not ok:
        fail("not confirmed (pass --yes to skip the question)")


class SafeGroup(click.Group):
    """A command group whose subcommands (and their groups) end on bad input with a one-line
    error, never a traceback, and whose usage errors show user text escaped."""

    group_class = type  # subgroups are SafeGroups too

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        """Parse this group's own options; escape what a usage error quotes."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            _escape_message(exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen subcommand; a too-deep value or a usage error stays one line."""
        try:
            return super().invoke(ctx)
        except RecursionError:
            fail(TOO_DEEP)
        except click.ClickException as exc:
            _escape_message(exc)
            raise


def _escape_message(exc: click.ClickException) -> None:
    # click types ``message`` as Final, but it is a plain attribute that show() reads.
    exc.message = _printable(exc.message)  # type: ignore[misc]


class SafeFormatter(logging.Formatter):
    """A log formatter that escapes control characters in messages and tracebacks
    (a traceback keeps its line breaks)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The formatted line, escaped."""
        return _printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        """The traceback, escaped: frames keep their lines, a message cannot add any."""
        exc_type, exc, tb = ei
        if exc is None:
            return _lines(super().formatException(ei))
        chunks = traceback.TracebackException(exc_type, exc, tb).format()
        return "".join(_chunk(c) for c in chunks).rstrip("\n")

    def formatStack(self, stack_info: str) -> str:
        """The stack, escaped line by line."""
        return _lines(super().formatStack(stack_info))


def _lines(text: str) -> str:
    return "\n".join(_printable(line) for line in text.split("\n"))


def _chunk(chunk: str) -> str:
    """One piece of a formatted traceback: a frame keeps its lines; anything else (the
    exception's message, the chaining notes) keeps only its leading and trailing breaks."""
    if chunk.startswith("  File "):
        return _lines(chunk)
    core = chunk.strip("\n")
    start = chunk.index(core) if core else len(chunk)
    return chunk[:start] + _printable(core) + chunk[start + len(core):]


JOB_COLUMNS = ("id", "kind", "queue", "state", "priority", "attempt", "max_attempts",
               "run_at", "tags")
