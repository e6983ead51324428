"""The CLI shows hostile data from the database safely: escaped, literal, cut short.

A job's kind, queue, tags, metadata, args and errors (and cron names, DLQ
reasons) may hold terminal escapes, line breaks, bidi overrides and rich
markup. Human output must show them as visible escapes and never act on them;
``--json`` must give the exact values back. Deeply nested JSON input is a
one-line error, and long values are cut short unless ``--full``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

import awa
from awa.cli.output import SafeFormatter

ROOT = Path(__file__).resolve().parent.parent

#: An OSC title change, a screen clear, a line break, a bidi override, rich markup,
#: a C1 control (CSI) and DEL.
EVIL = "\x1b]0;pwned\x07|\x1b[2J|\n|\u202e|[bold]x[/bold]|[link=http://e]l[/link]|\x9b|\x7f"
#: How EVIL must look in human output.
SHOWN = ("\\x1b]0;pwned\\x07", "\\x1b[2J", "\\n", "\\u202e", "[bold]x[/bold]",
         "[link=http://e]l[/link]", "\\x9b", "\\x7f")
RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e", "\u2066", "\u2069")


def awa_cli(url: str, *args: str, columns: int = 4000) -> subprocess.CompletedProcess[str]:
    """Run ``awa ARGS`` in a subprocess with no terminal and a wide virtual screen."""
    env = {k: v for k, v in os.environ.items() if k not in ("AWA_PROGRESS", "AWA_HEALTH_ADDR")}
    env.update(DATABASE_URL=url, COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "awa", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must succeed, checked safe for a terminal."""
    assert result.returncode == 0, result.stderr
    assert_safe(result.stdout + result.stderr)
    return result.stdout


def assert_safe(text: str) -> None:
    """No raw control or bidi character, and no traceback."""
    raw = sorted({hex(ord(ch)) for ch in text if ch in RAW})
    assert not raw, f"raw characters in output: {raw}"
    assert "Traceback" not in text


def assert_shown(text: str, times: int = 1) -> None:
    """Every piece of EVIL is visible, escaped (``times`` fields at least)."""
    for piece in SHOWN:
        assert text.count(piece) >= times, (piece, text)


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """A failure reported as one escaped line on stderr, no traceback."""
    assert result.returncode in (1, 2), result
    assert_safe(result.stdout + result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].lower().startswith("error"), result.stderr
    return lines[-1]


async def _hostile_jobs(client: awa.AsyncClient, conn: asyncpg.Connection) -> tuple[int, int]:
    """An available and a failed job with EVIL in every text field (written by SQL, as any
    producer or an older version could have)."""
    live = await client.insert({"a": EVIL}, kind="live")
    dead = await client.insert({"a": EVIL}, kind="dead")
    # Ring jobs (unless AWA_TEST_RING=0) move to awa.jobs first; a no-op otherwise.
    await conn.execute("SELECT count(*) FROM awa.ring_to_mutable($1::bigint[])",
                       [live.id, dead.id])
    await conn.execute(
        "UPDATE awa.jobs SET kind = 'k' || $1, queue = 'q' || $1, tags = ARRAY['t' || $1],"
        " metadata = jsonb_build_object('m', $1::text) WHERE id = ANY($2::bigint[])",
        EVIL, [live.id, dead.id])
    await conn.execute("UPDATE awa.jobs SET attempt = 1 WHERE id = $1", dead.id)
    await conn.execute("""
        WITH moved AS (DELETE FROM awa.jobs j WHERE id = $1 RETURNING j)
        INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
            LATERAL awa.finished(m.j, 'failed', interval '1 day',
                                 awa.error_entry($2, 1, true)) f""", dead.id, EVIL)
    return live.id, dead.id


async def test_tables_and_dumps_escape_every_field(database_url: str, client: awa.AsyncClient,
                                                   conn: asyncpg.Connection) -> None:
    live, dead = await _hostile_jobs(client, conn)
    table = ok(awa_cli(database_url, "job", "list"))
    assert_shown(table, times=2)  # kind, queue, tags of two jobs
    assert len(table.splitlines()) == 7  # title, 3 rules, header, 2 rows: nothing faked
    stats = ok(awa_cli(database_url, "queue", "stats"))
    assert_shown(stats)
    assert len(stats.splitlines()) == 6  # title, 3 rules, header, one queue: one row

    exact = json.loads(ok(awa_cli(database_url, "job", "list", "--json")))
    assert {j["kind"] for j in exact} == {"k" + EVIL}
    assert all(j["queue"] == "q" + EVIL and j["tags"] == ["t" + EVIL]
               and j["metadata"] == {"m": EVIL} and j["args"] == {"a": EVIL} for j in exact)
    assert json.loads(ok(awa_cli(database_url, "queue", "stats", "--json")))[0]["queue"] \
        == "q" + EVIL

    dump = ok(awa_cli(database_url, "job", "dump", str(dead)))
    assert json.loads(dump)["errors"][0]["error"] == EVIL  # still valid, exact JSON
    run = ok(awa_cli(database_url, "job", "dump-run", str(dead)))
    assert json.loads(run)["error"] == EVIL
    assert json.loads(ok(awa_cli(database_url, "job", "dump", str(dead), "--json"))) \
        == json.loads(dump)

    moved = ok(awa_cli(database_url, "dlq", "move", str(dead), "--reason", EVIL, "--yes"))
    assert moved.strip() == f"moved {dead}"
    dlq = ok(awa_cli(database_url, "dlq", "list"))
    assert_shown(dlq, times=2)  # kind and reason
    depth = ok(awa_cli(database_url, "dlq", "depth"))  # key/value: the key is the queue
    assert_shown(depth) and len(depth.splitlines()) == 1
    assert json.loads(ok(awa_cli(database_url, "dlq", "list", "--json")))[0]["reason"] == EVIL

    retried = ok(awa_cli(database_url, "dlq", "retry", str(dead), "--yes", "--full"))
    assert_shown(retried, times=2)  # kind and queue as text
    assert retried.count("\\u001b]0;pwned\\u0007") >= 4  # args, tags, metadata, errors as JSON
    fields = json.loads(ok(awa_cli(database_url, "job", "dump", str(dead), "--json")))
    assert sorted(line.split(" ", 1)[0] for line in retried.splitlines()) == sorted(fields)
    cancelled = ok(awa_cli(database_url, "job", "cancel", str(live), "--yes"))
    assert_shown(cancelled, times=2)


async def test_names_in_messages_and_usage_errors_are_escaped(
        database_url: str, conn: asyncpg.Connection) -> None:
    await conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args, priority, "
        "max_attempts, missed_fire_policy) VALUES ($1, '0 3 * * *', 'UTC', $1, $1, '{}', 2, 25, "
        "'coalesce')", "c" + EVIL)
    assert_shown(ok(awa_cli(database_url, "cron", "list")), times=3)  # name, kind, queue
    assert json.loads(ok(awa_cli(database_url, "cron", "list", "--json")))[0]["name"] \
        == "c" + EVIL
    assert_shown(ok(awa_cli(database_url, "cron", "pause", "c" + EVIL)))
    unknown_queue = assert_one_line_error(awa_cli(database_url, "queue", "pause", "q" + EVIL))
    assert_shown(unknown_queue)
    assert "--create" in unknown_queue
    paused = ok(awa_cli(database_url, "queue", "pause", "q" + EVIL, "--create"))
    assert_shown(paused) and len(paused.splitlines()) == 1
    assert_shown(assert_one_line_error(awa_cli(database_url, "job", "list", "--state", EVIL)))
    unknown = awa_cli(database_url, "job", "list", "--bogus" + EVIL)  # click's usage error
    assert unknown.returncode == 2 and "\\x1b[2J" in unknown.stderr
    assert_safe(unknown.stderr)


def _nested(depth: int) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


async def test_deeply_nested_json_is_a_one_line_error(database_url: str,
                                                      client: awa.AsyncClient,
                                                      conn: asyncpg.Connection) -> None:
    for command in (("enqueue", "deep", "--args", _nested(990)),
                    ("enqueue", "deep", "--args", _nested(50_000))):
        line = assert_one_line_error(awa_cli(database_url, *command))
        assert "nested too deeply" in line
    # Stored by another producer: showing it is either fine or one clean line.
    job = await client.insert({}, kind="deep")
    await conn.execute("SELECT count(*) FROM awa.ring_to_mutable($1::bigint[])", [job.id])
    await conn.execute("UPDATE awa.jobs SET args = $1::jsonb WHERE id = $2", _nested(990), job.id)
    for command in (("job", "list"), ("job", "list", "--json"), ("queue", "stats")):
        result = awa_cli(database_url, *command)
        if result.returncode:
            assert "nested too deeply" in assert_one_line_error(result)
        else:
            assert_safe(result.stdout + result.stderr)


async def test_long_values_are_cut_unless_full(database_url: str,
                                               client: awa.AsyncClient) -> None:
    big = "x" * 100_000
    job = await client.insert({"big": big}, kind="big", tags=["y" * 1000])
    table = ok(awa_cli(database_url, "job", "list", "--kind", "big"))
    assert '["' + "y" * 198 + "… (+804 bytes, use --full)" in table
    assert "y" * 199 not in table
    whole = ok(awa_cli(database_url, "job", "list", "--kind", "big", "--full"))
    assert '["' + "y" * 1000 + '"]' in whole

    flat = json.dumps({"big": big})
    cut = f"… (+{len(flat) - 64 * 1024} bytes, use --full)"
    dump = ok(awa_cli(database_url, "job", "dump", str(job.id)))
    assert json.loads(dump)["args"] == flat[:64 * 1024] + cut  # still valid JSON
    for flag in ("--full", "--json"):
        shown = ok(awa_cli(database_url, "job", "dump", str(job.id), flag))
        assert json.loads(shown)["args"] == {"big": big} and "use --full" not in shown
    run = ok(awa_cli(database_url, "job", "dump-run", str(job.id), "--attempt", "1"))
    assert json.loads(run)["args"] == flat[:64 * 1024] + cut

    cancelled = ok(awa_cli(database_url, "job", "cancel", str(job.id), "--yes"))
    assert flat[:100] not in cancelled  # a summary: args stay in `awa job dump`
    assert f"awa job dump {job.id}" in cancelled
    retried = ok(awa_cli(database_url, "job", "retry", str(job.id), "--yes", "--full"))
    assert flat in retried and "use --full" not in retried
    exact: Any = json.loads(ok(awa_cli(database_url, "job", "list", "--kind", "big", "--json")))
    assert exact[0]["args"] == {"big": big} and exact[0]["tags"] == ["y" * 1000]


def test_worker_log_lines_are_escaped() -> None:
    formatter = SafeFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError(EVIL)
    except ValueError:
        record = logging.LogRecord("awa", logging.WARNING, __file__, 1, "job of kind %s failed",
                                   ("k" + EVIL,), sys.exc_info())
    text = formatter.format(record)
    assert not {ch for ch in text if ch in RAW}
    first, *rest = text.split("\n")
    assert first.startswith("WARNING job of kind k\\x1b]0;pwned\\x07|") and "\\u202e" in first
    assert rest[0] == "Traceback (most recent call last):"  # the traceback keeps its lines
    assert rest[-1].startswith("ValueError: \\x1b]0;pwned\\x07|\\x1b[2J|")
