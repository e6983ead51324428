"""CLI tables, through real subprocesses: never cut when piped; ``--format tsv`` is one
escaped line per row, ``--format json`` the same as ``--json``.

Also the helpers the other piped-CLI tests use (`piped_cli`, `one_line_error`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import awa

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
#: A queue name longer than a whole 80-column screen.
LONG_QUEUE = "reports-" + "x" * 90


def cli_env(url: str, **extra: str) -> dict[str, str]:
    """The code under test (``$PYTHONPATH``, else this checkout's ``src``), no terminal
    size, no progress bars."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "AWA_PROGRESS", "AWA_HEALTH_ADDR")}
    path = [*filter(None, [env.get("PYTHONPATH")]), str(SRC), str(ROOT)]
    return {**env, "DATABASE_URL": url, "PYTHONPATH": os.pathsep.join(path), **extra}


def piped_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``awa ARGS`` with stdout piped (not a terminal) and no COLUMNS."""
    return subprocess.run([sys.executable, "-m", "awa", *args], env=cli_env(url), cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- tables: never cut when piped; --format tsv / json ----------------------------------


async def test_piped_tables_show_every_header_and_value_whole(
        database_url: str, client: awa.AsyncClient) -> None:
    await client.insert({"n": 1}, kind="send_email", queue=LONG_QUEUE)
    stats = ok(piped_cli(database_url, "queue", "stats"))
    assert "…" not in stats
    for header in ("queue", "available", "scheduled", "retryable", "running",
                   "waiting_external", "failed", "completed_last_hour", "lag_seconds", "paused"):
        assert f" {header} " in stats
    [row] = [line for line in stats.splitlines() if LONG_QUEUE in line]
    assert row.split("│")[2].strip() == "1"  # its available count, on the same line
    jobs = ok(piped_cli(database_url, "job", "list"))
    assert "…" not in jobs and LONG_QUEUE in jobs and "max_attempts" in jobs


async def test_tsv_is_one_escaped_line_per_row(database_url: str,
                                                client: awa.AsyncClient) -> None:
    tricky = "tab\there|line\nbreak|back\\slash|\x1b[2J"
    await client.insert({"n": 1}, kind=tricky, queue="tsv")
    await client.insert({"n": 2}, kind="k" * 150 + "\\" * 50, queue="tsv")  # 250 shown
    lines = ok(piped_cli(database_url, "job", "list", "--format", "tsv")).splitlines()
    header = ["id", "kind", "queue", "state", "priority", "attempt", "max_attempts", "run_at",
              "tags"]
    assert lines[0].split("\t") == header and len(lines) == 3
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == len(header) for row in rows)
    long_row, tricky_row = rows  # newest first
    assert tricky_row[1] == "tab\\there|line\\nbreak|back\\\\slash|\\x1b[2J"
    assert tricky_row[2:4] == ["tsv", "available"] and tricky_row[8] == "[]"
    assert long_row[1] == "k" * 150 + "\\" * 50 + "… (+25 bytes, use --full)"
    full = ok(piped_cli(database_url, "job", "list", "--format", "tsv", "--full"))
    assert "\t" + "k" * 150 + "\\" * 100 + "\t" in full

    # The global option, and a key/value answer.
    glob = ok(piped_cli(database_url, "--format", "tsv", "job", "list", "--queue", "tsv"))
    assert glob == "\n".join(lines) + "\n"
    assert ok(piped_cli(database_url, "--format", "tsv", "dlq", "depth", "--queue",
                      "tsv")) == "tsv\t0\n"
    # json is --json, exactly; a per-command choice beats the global one.
    exact = ok(piped_cli(database_url, "job", "list", "--json"))
    assert ok(piped_cli(database_url, "job", "list", "--format", "json")) == exact
    assert ok(piped_cli(database_url, "--format", "json", "job", "list")) == exact
    assert json.loads(exact)[1]["kind"] == tricky
    assert ok(piped_cli(database_url, "--format", "json", "job", "list", "--format",
                      "tsv")).splitlines()[0].split("\t") == header
    table = ok(piped_cli(database_url, "job", "list", "--format", "table"))
    assert "┃ id" in table and "\t" not in table
    clash = piped_cli(database_url, "job", "list", "--json", "--format", "tsv")
    assert clash.returncode == 2 and "Traceback" not in clash.stderr
    assert clash.stderr.strip().splitlines()[-1] == \
        "Error: --json and --format tsv contradict each other"
