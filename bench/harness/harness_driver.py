"""Run the postgresql-job-queue-benchmarking harness natively (no docker).

Started by run_harness.py inside the harness-runner venv:

    python harness_driver.py --harness PATH --results DIR -- run <bench.py run args>

It imports the harness's own ``bench_harness`` package from PATH and, before
handing the argument list to its CLI, points it at this machine:

* Postgres: the private cluster run_harness.py started (``pg_ctl``), not
  ``docker compose``.  ``postgres-restart`` phases stop it with
  ``pg_ctl stop -m fast`` (what the postgres image's SIGINT stop signal does)
  and start it again.  The cluster is left running between cells.
* Adapters: ``awa`` (awa_adapter.py in the harness-awa venv), ``awa-pg``
  (awa_pg_adapter.py in the harness-awa-pg venv) and ``procrastinate`` (the
  harness's own procrastinate-bench/main.py in the harness-procrastinate
  venv) launch as native processes instead of ``docker run``.
* A system whose adapter fails (crash mid-phase, no descriptor) is recorded in
  ``failures.json`` of the run directory and the next system still runs; the
  stock harness would abort the rest of the invocation.
* Results go to DIR instead of the clone's results/.

Configuration comes from environment variables set by run_harness.py:
HARNESS_PG_PORT, HARNESS_PG_BIN, HARNESS_PG_DATA, HARNESS_PG_RUNAS,
HARNESS_VENVS, HARNESS_ADAPTER_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _pg_ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = [
        os.path.join(os.environ["HARNESS_PG_BIN"], "pg_ctl"),
        "-D",
        os.environ["HARNESS_PG_DATA"],
        *args,
    ]
    runas = os.environ.get("HARNESS_PG_RUNAS")
    if runas:
        argv = ["runuser", "-u", runas, "--", *argv]
    print(f"[native-pg] $ {' '.join(argv)}", file=sys.stderr, flush=True)
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--harness", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    rest = ns.rest[1:] if ns.rest[:1] == ["--"] else ns.rest

    harness = Path(ns.harness).resolve()
    sys.path.insert(0, str(harness))
    import psycopg
    from bench_harness import adapters as adapters_mod
    from bench_harness import (
        orchestrator,
        versions,
    )
    from bench_harness.adapters import AdapterEntry, LaunchSpec

    port = int(os.environ.get("HARNESS_PG_PORT", "15555"))
    venvs = Path(os.environ["HARNESS_VENVS"])
    adapter_dir = Path(os.environ["HARNESS_ADAPTER_DIR"])

    # ---- Postgres: loopback, private cluster
    def pg_url(dbname: str, host: str = "127.0.0.1") -> str:
        return (
            f"postgresql://{adapters_mod.PG_USER}:{adapters_mod.PG_PASS}@127.0.0.1:{port}/{dbname}"
        )

    adapters_mod.PG_PORT = port
    adapters_mod.pg_url = pg_url
    orchestrator.pg_url = pg_url

    def wait_query_ready(timeout_s: float = 60.0) -> None:
        deadline = time.time() + timeout_s
        last: Exception | None = None
        while time.time() < deadline:
            try:
                with psycopg.connect(
                    pg_url("postgres"), autocommit=True, connect_timeout=3
                ) as conn:
                    conn.execute("SELECT 1").fetchone()
                return
            except psycopg.Error as exc:
                last = exc
                time.sleep(0.3)
        raise RuntimeError(f"Postgres not query-ready: {last}")

    def pg_running() -> bool:
        return _pg_ctl("status", check=False).returncode == 0

    def start_pg(_image: str | None = None) -> None:
        if not pg_running():
            _pg_ctl(
                "start",
                "-w",
                "-t",
                "60",
                "-l",
                os.path.join(os.environ["HARNESS_PG_DATA"], "server.log"),
            )
        wait_query_ready()

    def stop_pg_for_chaos(_image: str | None = None) -> None:
        _pg_ctl("stop", "-m", "fast", "-w", "-t", "60", check=False)

    orchestrator.start_postgres = start_pg
    orchestrator.stop_postgres = lambda _image=None: None  # run_harness.py stops it at the end
    orchestrator._compose_stop_postgres = stop_pg_for_chaos
    orchestrator._compose_start_postgres = start_pg
    orchestrator.RESULTS_ROOT = Path(ns.results).resolve()

    # ---- Adapters: native processes
    def venv_python(name: str) -> str:
        return str(venvs / f"harness-{name}" / "bin" / "python")

    def native(python: str, script: Path):
        def launch(manifest, overrides):
            env = adapters_mod._base_env(manifest, overrides)
            env["PYTHONUNBUFFERED"] = "1"
            return LaunchSpec(argv=[python, "-u", str(script)], env=env, cwd=str(script.parent))

        return launch

    def no_build(_skip: bool) -> None:
        return None

    reg = adapters_mod.ADAPTERS
    reg.clear()
    reg["awa"] = AdapterEntry(
        bench_dir=adapter_dir / "manifests" / "awa",
        builder=no_build,
        launcher=native(venv_python("awa"), adapter_dir / "awa_adapter.py"),
    )
    reg["awa-pg"] = AdapterEntry(
        bench_dir=adapter_dir / "manifests" / "awa-pg",
        builder=no_build,
        launcher=native(venv_python("awa-pg"), adapter_dir / "awa_pg_adapter.py"),
    )
    reg["procrastinate"] = AdapterEntry(
        bench_dir=harness / "procrastinate-bench",
        builder=no_build,
        launcher=native(venv_python("procrastinate"), harness / "procrastinate-bench" / "main.py"),
    )

    def pip_version(venv: str, dist: str):
        def capture() -> dict:
            out = subprocess.run(
                [
                    venv_python(venv),
                    "-c",
                    f"import importlib.metadata as m; print(m.version({dist!r}))",
                ],
                capture_output=True,
                text=True,
            )
            return {
                "source": f"venv harness-{venv}",
                "package": dist,
                "version": out.stdout.strip() or out.stderr.strip()[-200:],
            }

        return capture

    versions._CAPTURE["awa"] = pip_version("awa", "awa-queue")
    versions._CAPTURE["awa-pg"] = pip_version("awa-pg", "awa-pg")
    versions._CAPTURE["procrastinate"] = pip_version("procrastinate", "procrastinate")

    # ---- One failing system must not cancel the others in this invocation.
    failures: dict[str, str] = {}
    real_run_one = orchestrator.run_one_system

    def terminate_leftovers(system: str) -> None:
        """A stopped adapter can leave a long query running server-side (seen with
        awa-pg's depth query); end it so it does not load the next system's run."""
        try:
            db = adapters_mod.AdapterManifest.load(reg[system].bench_dir).db_name
            with psycopg.connect(pg_url("postgres"), autocommit=True, connect_timeout=5) as conn:
                rows = conn.execute(
                    "SELECT pid, now() - query_start, left(query, 120) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (db,),
                ).fetchall()
                for pid, age, q in rows:
                    print(
                        f"[native-driver] terminating leftover backend of {system}: pid={pid} "
                        f"running {age}: {q!r}",
                        file=sys.stderr,
                        flush=True,
                    )
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except Exception as exc:
            print(f"[native-driver] leftover check failed: {exc}", file=sys.stderr)

    def run_one_guarded(system: str, **kw):
        try:
            result = real_run_one(system, **kw)
            terminate_leftovers(system)
            return result
        except Exception as exc:
            failures[system] = f"{type(exc).__name__}: {exc}"
            print(f"[native-driver] {system} FAILED: {exc}", file=sys.stderr, flush=True)
            try:  # a chaos phase may have left Postgres down
                start_pg()
            except Exception as exc2:
                print(f"[native-driver] could not restart postgres: {exc2}", file=sys.stderr)
            return {"failed": failures[system]}

    orchestrator.run_one_system = run_one_guarded

    real_new_run_dir = orchestrator._new_run_dir
    made: list[Path] = []

    def new_run_dir(scenario):
        d = real_new_run_dir(os.environ.get("HARNESS_CELL") or scenario)
        made.append(d)
        return d

    orchestrator._new_run_dir = new_run_dir
    rc = orchestrator.main(rest)
    if made:
        (made[0] / "failures.json").write_text(json.dumps(failures, indent=2))
        print(f"[native-driver] run_dir={made[0]}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
