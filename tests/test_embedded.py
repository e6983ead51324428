"""The embedded PostgreSQL default (skip with ``-m "not embedded"``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from awa.db.embedded import (
    EmbeddedPostgresError,
    default_data_dir,
    embedded_database_url,
    stop_embedded,
)

pytestmark = pytest.mark.embedded

PRINT_URL = "from awa.db.embedded import embedded_database_url as u; print(u(), flush=True)"


async def _fetchval(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        if ";" in sql:  # a script: simple protocol, no result
            return await conn.execute(sql)
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def fetchval(url: str, sql: str) -> object:
    loop = asyncio.new_event_loop()  # not asyncio.run: leave pytest-asyncio's loop alone
    try:
        return loop.run_until_complete(_fetchval(url, sql))
    finally:
        loop.close()


def python(code: str, **env: str) -> subprocess.Popen[str]:
    """Start a Python that imports the same awa as this test."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **env}
    return subprocess.Popen([sys.executable, "-c", code], env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.strip()


def running(data_dir: Path) -> bool:
    return (data_dir / "pgdata" / "postmaster.pid").exists()


def test_start_reuse_stop_restart(tmp_path: Path) -> None:
    try:
        url = embedded_database_url(data_dir=tmp_path)
        assert url.startswith("postgresql://awa:") and "@127.0.0.1:" in url
        assert url.endswith("/awa")
        version = fetchval(url, "select version()")
        assert isinstance(version, str) and version.startswith("PostgreSQL 18"), version
        assert fetchval(url, "select rolsuper from pg_roles where rolname = current_user")
        assert int(str(fetchval(url, "show max_connections"))) >= 200
        assert fetchval(url, "show listen_addresses") == "127.0.0.1"

        assert embedded_database_url(data_dir=tmp_path) == url  # reused, not restarted
        fetchval(url, "create table kept (x int); insert into kept values (42)")

        stop_embedded(data_dir=tmp_path)
        assert not running(tmp_path)
        with pytest.raises(OSError):
            fetchval(url, "select 1")
        stop_embedded(data_dir=tmp_path)  # stopping a stopped server is fine

        url2 = embedded_database_url(data_dir=tmp_path)  # same cluster, recorded port
        assert url2 == url
        assert fetchval(url2, "select x from kept") == 42
    finally:
        stop_embedded(data_dir=tmp_path)


def test_concurrent_processes_share_one_server(tmp_path: Path) -> None:
    env = {"AWA_EMBEDDED_DIR": str(tmp_path)}
    first, second = python(PRINT_URL, **env), python(PRINT_URL, **env)
    urls = {finish(first), finish(second)}
    assert len(urls) == 1, urls
    assert not running(tmp_path)  # the process that started it stopped it at exit


def test_keep_and_reuse_from_another_process(tmp_path: Path) -> None:
    env = {"AWA_EMBEDDED_DIR": str(tmp_path), "AWA_EMBEDDED_KEEP": "1"}
    try:
        url = finish(python(PRINT_URL, **env))
        assert running(tmp_path)  # kept after its starter exited
        assert fetchval(url, "select 1") == 1
        assert embedded_database_url(data_dir=tmp_path) == url
        # We merely reused it: a child that reuses it and exits does not stop it either.
        assert finish(python(PRINT_URL, AWA_EMBEDDED_DIR=str(tmp_path))) == url
        assert running(tmp_path)
    finally:
        stop_embedded(data_dir=tmp_path)
    assert not running(tmp_path)


def test_start_failure_shows_log(tmp_path: Path) -> None:
    embedded_database_url(data_dir=tmp_path)
    stop_embedded(data_dir=tmp_path)
    with (tmp_path / "pgdata" / "postgresql.conf").open("a") as conf:
        conf.write("awa_no_such_setting = on\n")
    with pytest.raises(EmbeddedPostgresError, match="awa_no_such_setting") as info:
        embedded_database_url(data_dir=tmp_path)
    assert isinstance(info.value, RuntimeError)
    assert not running(tmp_path)


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWA_EMBEDDED_DIR", str(tmp_path / "explicit"))
    assert default_data_dir() == tmp_path / "explicit"
    monkeypatch.delenv("AWA_EMBEDDED_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if sys.platform == "linux":
        assert default_data_dir() == tmp_path / "xdg" / "awa" / "pg"


HOLD_URL = PRINT_URL + "; import sys; sys.stdin.readline()"  # uses it until told to exit


def _holder(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                "AWA_EMBEDDED_DIR": str(data_dir)}
    full_env.pop("AWA_EMBEDDED_KEEP", None)
    proc = subprocess.Popen([sys.executable, "-c", HOLD_URL], env=full_env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _release(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate("\n", timeout=120)
    assert proc.returncode == 0, err


def test_the_server_runs_while_any_process_uses_it(tmp_path: Path) -> None:
    try:
        worker, url = _holder(tmp_path)  # starts the server (as `awa worker` would)
        ui, same = _holder(tmp_path)  # reuses it (as `awa serve` started afterwards)
        assert same == url
        _release(worker)  # the process that started it exits first ...
        assert running(tmp_path) and fetchval(url, "select 1") == 1  # ... the UI still has it
        dead, _ = _holder(tmp_path)
        dead.kill()  # killed: its registration stays behind, and counts for nothing
        dead.wait()
        _release(ui)  # the last live user out stops it
        assert not running(tmp_path)
        assert [p.name for p in (tmp_path / "users").iterdir()] == []
    finally:
        stop_embedded(data_dir=tmp_path)


def test_a_stopped_database_is_one_line_per_subsystem_in_the_workers_log(
        tmp_path: Path) -> None:
    import asyncio as aio
    import time

    from tests.helpers import ROOT, SUBPROCESS_PATH

    import awa

    try:
        url = embedded_database_url(data_dir=tmp_path / "pg")
        aio.new_event_loop().run_until_complete(awa.migrate(url))
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": SUBPROCESS_PATH}
        log = tmp_path / "worker.log"
        with log.open("w") as err:
            worker = subprocess.Popen(
                [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client",
                 "--queue", "procs=2", "--set=poll_interval_ms=50"],
                env=env, cwd=ROOT, stderr=err)
            try:
                deadline = time.monotonic() + 60
                while "worker started" not in log.read_text():
                    assert time.monotonic() < deadline and worker.poll() is None
                    time.sleep(0.1)
                stop_embedded(data_dir=tmp_path / "pg")  # as another process would
                deadline = time.monotonic() + 60
                while log.read_text().count("the database is unreachable") < 5:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
                time.sleep(3)  # many more claim and reconnect attempts: they stay quiet
            finally:
                worker.terminate()
                worker.wait(timeout=60)
        lines = log.read_text().splitlines()
        assert not any("Traceback" in line for line in lines), "\n".join(lines)
        failed = [line for line in lines if " failed: " in line]
        subsystems = [line.split(" failed: ")[0].split(" ", 3)[-1] for line in failed]
        assert len(subsystems) == len(set(subsystems)), "\n".join(failed)  # one line each
        assert any("claim from 'procs'" in s for s in subsystems)
        assert len(lines) < 40, "\n".join(lines)
    finally:
        stop_embedded(data_dir=tmp_path / "pg")


def test_awa_serve_uses_the_embedded_server_from_its_start(tmp_path: Path) -> None:
    from tests.helpers import ROOT, SUBPROCESS_PATH

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "AWA_EMBEDDED_KEEP")}
    env.update(AWA_EMBEDDED_DIR=str(tmp_path), PYTHONPATH=SUBPROCESS_PATH)
    serve = subprocess.Popen([sys.executable, "-m", "awa", "serve", "--port", "0"], env=env,
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert serve.stderr is not None
        assert "Awa UI on http://127.0.0.1:" in serve.stderr.readline()
        # before any request: running, and this process counted as one of its users
        assert running(tmp_path)
        assert [p.name for p in (tmp_path / "users").iterdir()] == [str(serve.pid)]
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert not running(tmp_path)  # it was the last user


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another account")
def test_it_stops_after_a_directory_above_lost_its_search_bit(tmp_path: Path) -> None:
    """Another pytest session resets /tmp/pytest-of-root to 0700 while ours runs; the
    server account's pg_ctl must still reach the data directory to stop it."""
    outer = tmp_path / "outer"
    url = embedded_database_url(data_dir=outer / "pg")
    try:
        assert fetchval(url, "SELECT 1") == 1
        outer.chmod(0o700)  # o+x gone, as a tmp cleaner or that pytest session leaves it
        stop_embedded(data_dir=outer / "pg")
        with pytest.raises((OSError, asyncpg.PostgresError)):
            fetchval(url, "SELECT 1")
    finally:
        stop_embedded(data_dir=outer / "pg")
