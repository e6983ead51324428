"""Orchestrator-side helpers shared by bench/soak.py, scale_out.py and scheduled.py.

Those scripts start like run.py: any Python >= 3.11 runs them, they re-execute
themselves in bench/.venvs/_runner (psycopg, matplotlib) and run Awa itself in
bench/.venvs/awa (the repo's working tree, installed the way run.py installs
it).  Each script doubles as its own worker/producer: the orchestrator starts
``<awa venv python> -P <script> --role ...`` subprocesses that speak run.py's
``@@BENCH`` line protocol (systems/benchkit.py).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path

import run as bench  # bench/run.py (this directory is on sys.path)

BENCH = bench.BENCH
RESULTS = bench.RESULTS
DEFAULT_URL = bench.DEFAULT_URL


def bootstrap(script: str) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - started by any python
        sys.exit(f"{Path(script).name} needs Python >= 3.11")
    bench.ensure_runner(script)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", DEFAULT_URL),
        help="admin URL of the server (default $DATABASE_URL or %(default)s)",
    )
    p.add_argument(
        "--awa-source",
        default=os.environ.get("BENCH_AWA_SOURCE", str(bench.REPO)),
        help="what to pip-install as awa (default: the repo root)",
    )
    p.add_argument("--reinstall", action="store_true", help="recreate bench/.venvs/awa")
    p.add_argument("--keep-db", action="store_true", help="leave the database in place")


def write_report(name: str, report: dict, md: str) -> None:
    """results/<name>.json and <name>.md, and the Markdown on stdout."""
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (RESULTS / f"{name}.md").write_text(md)
    print()
    print(md)


def logdir(name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = RESULTS / "runs" / f"{stamp}-{name}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def admin_for(args, dbs: list[str]) -> bench.Admin:
    """Admin connection; `dbs` (and their _tpl templates) become the only databases
    this script may create or drop."""
    for db in dbs:
        bench.ALLOWED_DBS.update({db, db + "_tpl"})
    admin = bench.Admin(args.database_url)
    env = admin.server_info()
    if env["synchronous_commit"] != "on":
        sys.exit("synchronous_commit is not 'on' on this server; refusing to benchmark")
    return admin


def environment(admin: bench.Admin) -> dict:
    env = admin.server_info()
    env["cpus"] = os.cpu_count()
    env["python"] = platform.python_version()
    return env


def env_line(env: dict) -> str:
    return (
        f"PostgreSQL {env['server_version']} · synchronous_commit={env['synchronous_commit']} · "
        f"fsync={env['fsync']} · autovacuum={env['autovacuum']} · {env['cpus']} CPUs · "
        f"Python {env['python']}"
    )


def awa_driver(args, db: str, logs: Path) -> bench.Driver:
    """bench/.venvs/awa (created or refreshed) and a Driver for bench/systems/awa.py on `db`."""
    try:
        venv = bench.ensure_venv("awa", args, logs)
    except bench.Skip as e:
        sys.exit(f"cannot install awa: {e}")
    return bench.Driver("awa", venv, bench.db_url(args.database_url, db), logs)


def role(drv: bench.Driver, script: str, *extra: str, prefix: list[str] | None = None,
         url: str | None = None) -> bench.Proc:
    """Start `script --role ...` with the awa venv's python (optionally under `prefix`,
    e.g. ``ip netns exec NS``), as an interactive @@BENCH process."""
    cmd = [*(prefix or []), drv.py, "-P", str(Path(script).resolve()), *extra,
           "--url", url or drv.url]
    return bench.Proc(drv, cmd)


def pct(values, q: float) -> float | None:
    v = bench.pct(list(values), q)
    return None if v != v else v


def fmt(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return bench.fmt(v)
