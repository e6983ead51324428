#!/usr/bin/env python3
"""Awa vs. peers benchmark: one command, one PostgreSQL, ratios within one run.

    python bench/run.py                      # all systems, all scenarios
    python bench/run.py --quick              # smoke test, small N
    python bench/run.py --systems awa-pg,pgqueuer --scenarios drain-1w,latency

Needs only a Python >= 3.11 to start: it creates bench/.venvs/_runner (psycopg,
for the admin connection) and re-executes itself there, then one virtualenv
per system under bench/.venvs/<system>.  Each system is driven by
bench/systems/<driver>.py, run as a subprocess with that venv's python
(protocol: see bench/systems/benchkit.py).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
VENVS = BENCH / ".venvs"
RESULTS = BENCH / "results"
DRIVERS = BENCH / "systems"
MARK = "@@BENCH "

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# matplotlib: the PNG plots of bench/soak.py and bench/scheduled.py (never a package dependency)
RUNNER_REQS = ["psycopg[binary]>=3.1", "matplotlib>=3.7"]
# Every driver venv also gets psycopg, used only by the read-only verification queries.
COMMON_REQS = ["psycopg[binary]>=3.1"]

SYSTEMS: dict[str, dict] = {
    "awa": {
        "db": "bench_awa",
        "driver": "awa.py",
        "reqs": [],  # the repo itself, installed from REPO (see ensure_venv)
        "local": True,
    },
    # Optional A/B arm: another checkout of this repo (--awa-base-source), e.g. main,
    # driven exactly as `awa`, so a change is compared with its base in one run.
    "awa-base": {
        "db": "bench_awabase",
        "driver": "awa.py",
        "reqs": [],
        "local": True,
        "source_arg": "awa_base_source",
    },
    "awa-pg": {"db": "bench_awapg", "driver": "awa_pg.py", "reqs": ["awa-pg==0.6.9"]},
    "pgqueuer": {
        "db": "bench_pgqueuer",
        "driver": "pgqueuer.py",
        "reqs": ["pgqueuer==1.6.0", "asyncpg>=0.29"],
    },
    "procrastinate": {
        "db": "bench_procrastinate",
        "driver": "procrastinate.py",
        "reqs": ["procrastinate==3.10.0", "psycopg[binary,pool]>=3.1"],
    },
    # The ceiling: the fewest statements PostgreSQL allows, no framework (systems/rawsql.py).
    "raw-sql": {"db": "bench_rawsql", "driver": "rawsql.py", "reqs": ["asyncpg>=0.29"]},
}
CEILING = "raw-sql"  # drain throughput of every system is also reported as a fraction of it
# Only these databases are ever created, dropped or analyzed: bench_<system> and
# its template bench_<system>_tpl (the schema, installed once per run).
ALLOWED_DBS = {s["db"] for s in SYSTEMS.values()} | {s["db"] + "_tpl" for s in SYSTEMS.values()}

SCENARIOS = ["insert-single", "insert-bulk", "drain-1w", "drain-2w", "latency"]
DRAINS = ("drain-1w", "drain-2w")  # run in rounds (--rounds), the median reported
CONCURRENCY = 32


# ===========================================================================
# bootstrap: run inside bench/.venvs/_runner


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", DEFAULT_URL),
        help="admin URL (default $DATABASE_URL or %(default)s); each system gets its own "
        "database bench_<system> on that server, dropped and recreated per scenario",
    )
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s != "awa-base"),
                   help="comma list, default: all but awa-base")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list, default: all")
    p.add_argument(
        "--jobs", type=int, default=None, help="N for insert-bulk and the drains (20000)"
    )
    p.add_argument(
        "--rounds", type=int, default=3,
        help="drain rounds per system, interleaved; the median round is reported (3)",
    )
    p.add_argument("--single-jobs", type=int, default=None, help="N for insert-single (2000)")
    p.add_argument("--latency-seconds", type=float, default=None, help="producer run time (10)")
    p.add_argument("--latency-rate", type=float, default=50.0, help="producer jobs/s (50)")
    p.add_argument("--quick", action="store_true", help="small N for smoke testing")
    p.add_argument("--baseline", default="awa", help="ratios are BASELINE / peer (default awa)")
    p.add_argument("--reinstall", action="store_true", help="recreate the per-system venvs")
    p.add_argument(
        "--awa-source",
        default=os.environ.get("BENCH_AWA_SOURCE", str(REPO)),
        help="what to pip-install as the 'awa' system (default: the repo root)",
    )
    p.add_argument(
        "--awa-base-source",
        default=os.environ.get("BENCH_AWA_BASE_SOURCE"),
        help="what to pip-install as the 'awa-base' system (an A/B arm, e.g. a main checkout)",
    )
    p.add_argument("--keep-dbs", action="store_true", help="leave the bench_* databases in place")
    p.add_argument(
        "--rawsql-async-claim",
        action="store_true",
        help="raw-sql claims commit with synchronous_commit=off for their own transaction, "
        "as Awa's claims did until issue 40 (default: every raw-sql commit is synchronous)",
    )
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    a.scenarios = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    for s in a.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; known: {', '.join(SYSTEMS)}")
    if "awa-base" in a.systems and not a.awa_base_source:
        p.error("awa-base needs --awa-base-source PATH (e.g. a checkout of main)")
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}; known: {', '.join(SCENARIOS)}")
    if a.quick:
        a.jobs = a.jobs or 3000
        a.single_jobs = a.single_jobs or 300
        a.latency_seconds = a.latency_seconds or 4.0
    a.jobs = a.jobs or 20000
    a.single_jobs = a.single_jobs or 2000
    a.latency_seconds = a.latency_seconds or 10.0
    return a


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def base_python() -> str:
    return os.environ.get("BENCH_BASE_PYTHON") or sys.executable


def run_logged(cmd: list[str], log: Path, timeout: float = 1800) -> int:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, stdin=subprocess.DEVNULL
            ).returncode
        except subprocess.TimeoutExpired:
            f.write("TIMEOUT\n")
            return 124


def make_venv(venv: Path, log: Path) -> bool:
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    rc = run_logged([base_python(), "-m", "venv", str(venv)], log)
    return rc == 0 and venv_python(venv).exists()


def pip(venv: Path, args: list[str], log: Path) -> bool:
    cmd = [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check", *args]
    return run_logged(cmd, log) == 0


def stamp_of(reqs: list[str], extra: str = "") -> str:
    key = json.dumps([sys.version_info[:2], base_python(), sorted(reqs), extra])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def ensure_runner(script: str | Path | None = None) -> None:
    """Re-exec `script` (default: this file) inside bench/.venvs/_runner, creating it on
    first use.  bench/soak.py, scale_out.py and scheduled.py start the same way."""
    venv = VENVS / "_runner"
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    stamp = venv / "bench-stamp"
    want = stamp_of(RUNNER_REQS)
    if not (stamp.exists() and stamp.read_text() == want and venv_python(venv).exists()):
        VENVS.mkdir(parents=True, exist_ok=True)
        log = VENVS / "_runner-install.log"
        print(f"[setup] creating {venv.relative_to(REPO)} (log: {log})", flush=True)
        if not (make_venv(venv, log) and pip(venv, ["-q", *RUNNER_REQS], log)):
            sys.exit(f"could not create the runner venv, see {log}")
        stamp.write_text(want)
    env = dict(os.environ, BENCH_BASE_PYTHON=base_python())
    py = str(venv_python(venv))
    os.execve(py, [py, str(Path(script or __file__).resolve()), *sys.argv[1:]], env)


# ===========================================================================
# per-system venvs


class Skip(Exception):
    pass


def ensure_venv(name: str, args, logdir: Path) -> Path:
    spec = SYSTEMS[name]
    src = Path(getattr(args, spec.get("source_arg", "awa_source")) or "").resolve()
    venv = VENVS / name
    log = logdir / f"install-{name}.log"
    reqs = [*spec["reqs"], *COMMON_REQS]
    extra = ""
    if spec.get("local"):
        pyproject = src / "pyproject.toml"
        if not pyproject.exists():
            raise Skip(f"{src} has no pyproject.toml yet, nothing to install")
        extra = str(src) + hashlib.sha256(pyproject.read_bytes()).hexdigest()
    want = stamp_of(reqs, extra)
    stamp = venv / "bench-stamp"
    fresh = args.reinstall or not (stamp.exists() and stamp.read_text() == want)
    if fresh:
        print(f"[setup] creating venv {venv.relative_to(REPO)} ...", flush=True)
        if not make_venv(venv, log):
            raise Skip(f"venv creation failed, see {log}")
        if not pip(venv, ["-q", *reqs], log):
            raise Skip(f"pip install {' '.join(reqs)} failed, see {log}")
    if spec.get("local"):
        # Always reinstall the repo so the run measures the current working tree.
        # setuptools stages it in build/lib and never removes what was deleted
        # since: a removed migration was being installed again.
        shutil.rmtree(src / "build", ignore_errors=True)
        ok = pip(venv, ["-q", str(src)], log) if fresh else True
        ok = ok and pip(venv, ["-q", "--no-deps", "--force-reinstall", str(src)], log)
        if not ok:
            stamp.unlink(missing_ok=True)
            tail = "".join(log.read_text().splitlines(True)[-6:]) if log.exists() else ""
            raise Skip(f"pip install {src} failed (log: {log}):\n{tail}")
    stamp.write_text(want)
    return venv


# ===========================================================================
# database admin (runner venv has psycopg)


def db_url(admin_url: str, dbname: str) -> str:
    u = urllib.parse.urlsplit(admin_url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))


class Admin:
    def __init__(self, url: str) -> None:
        import psycopg

        self.psycopg = psycopg
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)

    def one(self, sql: str, *params):
        return self.conn.execute(sql, params or None).fetchone()[0]

    def server_info(self) -> dict:
        names = ("synchronous_commit", "fsync", "autovacuum", "shared_buffers", "max_connections")
        info = {n: self.one(f"SHOW {n}") for n in names}
        info["server_version"] = self.one("SHOW server_version")
        return info

    def postmaster_pid(self) -> int | None:
        pid = self.one("SELECT pg_backend_pid()")
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("PPid:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def reset(self, dbname: str, template: str | None = None) -> None:
        if dbname not in ALLOWED_DBS or (template and template not in ALLOWED_DBS):
            raise RuntimeError(f"refusing to touch {dbname!r}")  # never touch anything else
        self.conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if template:
            self.conn.execute(f'CREATE DATABASE "{dbname}" TEMPLATE "{template}"')
        else:
            self.conn.execute(f'CREATE DATABASE "{dbname}"')
        with self.psycopg.connect(db_url(self.url, dbname), autocommit=True) as c:
            sc = c.execute("SELECT current_setting('synchronous_commit')").fetchone()[0]
        if sc != "on":
            raise RuntimeError(f"synchronous_commit is {sc!r} in {dbname}; refusing to benchmark")

    def analyze(self, dbname: str) -> None:
        if dbname not in ALLOWED_DBS:
            raise RuntimeError(f"refusing to touch {dbname!r}")
        with self.psycopg.connect(db_url(self.url, dbname), autocommit=True) as c:
            c.execute("ANALYZE")

    def drop(self, dbname: str) -> None:
        if dbname in ALLOWED_DBS:
            self.conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


# ===========================================================================
# CPU accounting from /proc


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CLIENT_RE = re.compile(r"^(\S+\(\d+\)|\[local\])$")


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime ticks) of a process, all its threads included."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = s[s.rfind(")") + 2 :].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


class PgCpu:
    """CPU seconds used by this server's processes that serve `dbname`.

    Counts the postmaster's children that are either client backends connected
    to `dbname` or auxiliary processes (WAL writer, checkpointer, background
    writer, autovacuum, ...); backends of other databases are excluded.  A
    background thread samples every 0.25 s so backends that exit mid-run keep
    the CPU they had at their last sample.
    """

    def __init__(self, postmaster: int | None, dbname: str) -> None:
        self.postmaster = postmaster
        self.dbname = dbname
        self.base: dict[int, int] = {}
        self.last: dict[int, int] = {}
        # Backends of *other* databases on this shared server: not counted as
        # ours, but their CPU says how busy the server was with someone else
        # (their WAL is in the server-wide WAL figure too).
        self.other_base: dict[int, int] = {}
        self.other_last: dict[int, int] = {}
        self.stop_ev = threading.Event()
        self.thread: threading.Thread | None = None

    def _ours(self, pid: int) -> bool | None:
        """True: ours; False: a backend of another database; None: gone."""
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        toks = cmd.split()
        if self.dbname in toks:
            return True
        return not any(_CLIENT_RE.match(t) for t in toks)  # auxiliary process

    def _scan(self) -> tuple[dict[int, int], dict[int, int]]:
        out: dict[int, int] = {}
        other: dict[int, int] = {}
        if not self.postmaster:
            return out, other
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            pid = int(d)
            st = proc_stat(pid)
            if st and st[0] == self.postmaster:
                ours = self._ours(pid)
                if ours:
                    out[pid] = st[1]
                elif ours is False:
                    other[pid] = st[1]
        return out, other

    def _update(self) -> None:
        ours, other = self._scan()
        self.last.update(ours)
        for pid, v in other.items():
            self.other_base.setdefault(pid, 0)  # started during the window
            self.other_last[pid] = v

    def _loop(self) -> None:
        while not self.stop_ev.wait(0.25):
            self._update()

    def other_cpu(self) -> float | None:
        """CPU seconds of other databases' backends during the window."""
        if not self.postmaster:
            return None
        ticks = sum(v - self.other_base.get(pid, v) for pid, v in self.other_last.items())
        return ticks / CLK_TCK

    def start(self) -> None:
        self.base, self.other_base = self._scan()
        self.last = dict(self.base)
        self.other_last = dict(self.other_base)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self) -> float | None:
        self.stop_ev.set()
        if self.thread:
            self.thread.join()
        if not self.postmaster:
            return None
        self._update()
        ticks = sum(v - self.base.get(pid, 0) for pid, v in self.last.items())
        return ticks / CLK_TCK


# ===========================================================================
# driver processes


class DriverError(Exception):
    pass


class Driver:
    def __init__(self, name: str, venv: Path, url: str, logdir: Path) -> None:
        self.name = name
        self.py = str(venv_python(venv))
        self.path = str(DRIVERS / SYSTEMS[name]["driver"])
        self.url = url
        self.log = logdir / f"driver-{name}.log"

    def cmd(self, command: str, *extra: str, url: str | None = None) -> list[str]:
        return [self.py, "-P", self.path, command, "--url", url or self.url, *extra]

    def call(self, command: str, *extra: str, timeout: float = 600, url: str | None = None) -> dict:
        with open(self.log, "a") as f:
            f.write(f"\n=== {command} {' '.join(extra)}\n")
            f.flush()
            try:
                p = subprocess.run(
                    self.cmd(command, *extra, url=url),
                    stdout=subprocess.PIPE,
                    stderr=f,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as e:
                raise DriverError(f"{command}: timed out after {timeout:.0f}s") from e
            f.write(p.stdout)
        lines = [ln[len(MARK) :] for ln in p.stdout.splitlines() if ln.startswith(MARK)]
        if p.returncode != 0 or not lines:
            raise DriverError(f"{command}: exit code {p.returncode}; see {self.log}")
        return json.loads(lines[-1])

    def spawn(self, command: str, *extra: str) -> Proc:
        return Proc(self, self.cmd(command, *extra))


def fresh_db(drv: Driver, admin: Admin, db: str) -> None:
    """Give `db` a freshly installed schema.

    The library's own schema install runs once per run into bench_<system>_tpl;
    each scenario then gets a new copy of it (CREATE DATABASE ... TEMPLATE), so
    slow migrations do not eat the time budget and every scenario starts from
    the same empty, freshly installed state.
    """
    tpl = db + "_tpl"
    if not getattr(drv, "template_ready", False):
        admin.reset(tpl)
        r = drv.call("setup", timeout=600, url=db_url(admin.url, tpl))
        drv.setup_seconds = r.get("seconds")
        drv.setup_info = r
        drv.template_ready = True
    admin.reset(db, template=tpl)


class Proc:
    """An interactive driver process (worker mode)."""

    def __init__(self, driver: Driver, cmd: list[str]) -> None:
        self.logf = open(driver.log, "a")
        self.logf.write(f"\n=== {' '.join(cmd[2:4])} (interactive)\n")
        self.logf.flush()
        self.p = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.logf,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue = queue.Queue()
        self.handled = 0
        self.last_progress_t = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout
        for line in self.p.stdout:
            if not line.startswith(MARK):
                self.logf.write(line)
                continue
            ev = json.loads(line[len(MARK) :])
            if ev.get("event") == "progress":
                with self.lock:
                    self.handled = ev["handled"]
                    self.last_progress_t = ev["t"]
                continue
            self.events.put(ev)
        self.events.put({"event": "eof"})

    def send(self, word: str) -> None:
        try:
            assert self.p.stdin
            self.p.stdin.write(word + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def wait_event(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DriverError(f"timed out waiting for {name!r}")
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.get("event") == name:
                return ev
            if ev.get("event") == "eof":
                raise DriverError(f"driver exited (rc={self.p.wait()}) while waiting for {name!r}")

    def kill(self) -> None:
        """Kill it if it still runs (our own child, by its handle): cleanup after a run."""
        if self.p.poll() is None:
            self.p.kill()

    def finish(self) -> None:
        self.send("exit")
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()  # our own child, by its handle
            self.p.wait()
        self.logf.close()


# ===========================================================================
# scenarios


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def verify(
    drv: Driver, admin: Admin, db: str, *, completed: int = 0, queued: int = 0, handled=None
) -> dict:
    admin.analyze(db)  # autovacuum may be off: fresh statistics keep the view plans sane
    c = drv.call("verify", timeout=600)
    problems = []
    if c["completed"] != completed:
        problems.append(f"completed {c['completed']} != {completed}")
    if c["completed_distinct"] != completed:
        problems.append(f"distinct completed {c['completed_distinct']} != {completed}")
    if queued:
        if c["queued"] != queued or c["queued_distinct"] != queued:
            problems.append(f"queued {c['queued']} (distinct {c['queued_distinct']}) != {queued}")
    elif c["unfinished"]:
        problems.append(f"{c['unfinished']} jobs left queued/running")
    if c.get("failed"):
        problems.append(f"{c['failed']} failed/cancelled")
    if handled is not None and handled != completed:
        problems.append(f"handler ran {handled} times for {completed} jobs")
    c["ok"] = not problems
    c["problems"] = problems
    return c


def sc_insert(drv: Driver, admin: Admin, db: str, kind: str, n: int) -> dict:
    fresh_db(drv, admin, db)
    r = drv.call(kind, "--n", str(n), timeout=max(300, n / 20))
    out = {
        "n": r["n"],
        "seconds": r["seconds"],
        "jobs_per_s": r["n"] / r["seconds"],
        "client_cpu_s": r.get("client_cpu"),
    }
    out["verify"] = verify(drv, admin, db, queued=n)
    return out


def run_workers(
    drv: Driver,
    procs: list[Proc],
    admin: Admin,
    db: str,
    postmaster,
    expect: int,
    timeout: float,
    between=None,
) -> dict:
    for p in procs:
        p.wait_event("ready", 180)
    pg = PgCpu(postmaster, db)
    pg.start()
    # WAL is server-wide: the systems run one after the other, so this window
    # holds this system's writes (plus whatever other databases wrote meanwhile,
    # see other_db_cpu_s).
    lsn0 = admin.one("SELECT pg_current_wal_lsn()::text")
    t_go = time.time()
    for p in procs:
        p.send("go")
    started = [p.wait_event("started", 120) for p in procs]
    produced = None
    if between is not None:
        produced = between()
        expect = produced
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        total = sum(p.handled for p in procs)
        if total >= expect:
            break
        if any(p.p.poll() is not None for p in procs):
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.005)
    t_handled = max(p.last_progress_t for p in procs)
    for p in procs:
        p.send("stop")
    results = [p.wait_event("result", 60) for p in procs]
    wal = admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", lsn0)
    pg_cpu = pg.stop()
    other_cpu = pg.other_cpu()
    # A transaction holding an XID anywhere on the server holds back the xmin horizon
    # of every database: rows deleted during the drain can then be neither pruned nor
    # skipped cheaply by index scans, which slows every queue that churns.
    held = admin.conn.execute(
        "SELECT datname, extract(epoch FROM now() - xact_start)::float8 FROM pg_stat_activity "
        "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1"
    ).fetchone()
    for p in procs:
        p.finish()
    handled = sum(r["handled"] for r in results)
    t_end = max(r["t_stopped"] for r in results)
    wall = t_end - t_go
    worker_cpu = sum(r["cpu"] for r in results)
    out = {
        "n": expect,
        "handled": handled,
        "workers": len(procs),
        "seconds": wall,
        "jobs_per_s": expect / wall if wall > 0 else None,
        "handler_seconds": t_handled - t_go,
        "start_seconds": max(r.get("start_seconds", 0.0) for r in started),
        "stop_seconds": max(r["stop_seconds"] for r in results),
        "worker_cpu_s": worker_cpu,
        "pg_cpu_s": pg_cpu,
        "worker_cpu_per_1k": worker_cpu / expect * 1000 if expect else None,
        "pg_cpu_per_1k": pg_cpu / expect * 1000 if (expect and pg_cpu is not None) else None,
        "wal_bytes": wal,
        "wal_per_job": wal / expect if expect else None,
        "other_db_cpu_s": other_cpu,
        "oldest_xact": {"db": held[0], "age_s": held[1]} if held else None,
        "results": results,
    }
    if timed_out:
        out["error"] = f"timeout: handled {sum(p.handled for p in procs)}/{expect}"
    return out


def sc_drain(drv: Driver, admin: Admin, db: str, postmaster, n: int, workers: int) -> dict:
    fresh_db(drv, admin, db)
    pre = drv.call("insert-bulk", "--n", str(n), timeout=max(300, n / 20))
    admin.analyze(db)
    procs = [drv.spawn("worker", "--concurrency", str(CONCURRENCY)) for _ in range(workers)]
    try:
        out = run_workers(drv, procs, admin, db, postmaster, n, timeout=max(120, n / 50))
    finally:
        for p in procs:
            p.kill()
    for r in out.pop("results"):
        r.pop("latencies_ms", None)
    out["prefill_seconds"] = pre["seconds"]
    out["verify"] = verify(drv, admin, db, completed=n, handled=out["handled"])
    return out


def median_round(rounds: list[dict]) -> dict:
    """The round of median throughput, whole (its CPU and WAL figures with it),
    plus every round's jobs/s; a round that failed makes the result failed."""
    failed = [r for r in rounds if "error_only" in r or "error" in r
              or not r.get("verify", {}).get("ok")]
    every = {"round_jobs_per_s": [r.get("jobs_per_s") for r in rounds], "all_rounds": rounds}
    if failed:
        return {**failed[0], **every}
    ordered = sorted(rounds, key=lambda r: r["jobs_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], **every}


def sc_latency(drv: Driver, admin: Admin, db: str, postmaster, rate: float, seconds: float) -> dict:
    fresh_db(drv, admin, db)
    admin.analyze(db)
    procs = [drv.spawn("worker", "--concurrency", str(CONCURRENCY), "--latency")]

    def produce() -> int:
        time.sleep(1.0)  # let the worker settle into its idle state
        r = drv.call(
            "produce", "--rate", str(rate), "--duration", str(seconds), timeout=seconds * 3 + 120
        )
        produce.info = r
        return r["n"]

    try:
        out = run_workers(drv, procs, admin, db, postmaster, 0, timeout=60, between=produce)
    finally:
        for p in procs:
            p.kill()
    lat = [x for r in out.pop("results") for x in (r.get("latencies_ms") or [])]
    n = out["n"]
    res = {
        "n": n,
        "rate": rate,
        "producer_late": produce.info.get("late"),
        "p50_ms": pct(lat, 0.50),
        "p95_ms": pct(lat, 0.95),
        "p99_ms": pct(lat, 0.99),
        "max_ms": max(lat) if lat else None,
        "mean_ms": sum(lat) / len(lat) if lat else None,
        "handled": out["handled"],
    }
    if "error" in out:
        res["error"] = out["error"]
    res["verify"] = verify(drv, admin, db, completed=n, handled=out["handled"])
    return res


# ===========================================================================
# report

# (scenario, metric key, label, higher_is_better)
METRICS = [
    ("insert-single", "jobs_per_s", "single insert, jobs/s", True),
    ("insert-bulk", "jobs_per_s", "bulk insert, jobs/s", True),
    ("drain-1w", "jobs_per_s", "drain 1 worker x32, jobs/s", True),
    ("drain-1w", "ceiling_fraction", "drain 1w: share of the raw-SQL ceiling", True),
    ("drain-1w", "worker_cpu_per_1k", "drain 1w: worker CPU s / 1k jobs", False),
    ("drain-1w", "pg_cpu_per_1k", "drain 1w: Postgres CPU s / 1k jobs", False),
    ("drain-1w", "wal_per_job", "drain 1w: WAL bytes / job", False),
    ("drain-2w", "jobs_per_s", "drain 2 workers x32, jobs/s", True),
    ("drain-2w", "ceiling_fraction", "drain 2w: share of the raw-SQL ceiling", True),
    ("drain-2w", "worker_cpu_per_1k", "drain 2w: worker CPU s / 1k jobs", False),
    ("drain-2w", "pg_cpu_per_1k", "drain 2w: Postgres CPU s / 1k jobs", False),
    ("drain-2w", "wal_per_job", "drain 2w: WAL bytes / job", False),
    ("latency", "p50_ms", "pickup latency p50, ms", False),
    ("latency", "p95_ms", "pickup latency p95, ms", False),
    ("latency", "p99_ms", "pickup latency p99, ms", False),
]
# Rows whose ratio column would only repeat another row's (the share of the
# ceiling is jobs/s divided by the same number for every system).
NO_RATIO = {"ceiling_fraction"}


def add_ceiling(report: dict) -> None:
    """Each system's drain jobs/s as a fraction of the raw-SQL ceiling's, same run."""
    res = report["results"]
    for scen in DRAINS:
        top, ok = cell(res, CEILING, scen, "jobs_per_s")
        if not top or not ok:
            continue
        for s in report["systems"]:
            r = res.get(s, {}).get(scen)
            if r and "error_only" not in r and r.get("jobs_per_s"):
                r["ceiling_fraction"] = r["jobs_per_s"] / top


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"


def cell(res: dict, sysname: str, scen: str, key: str):
    r = res.get(sysname, {}).get(scen)
    if not r or "error_only" in r:
        return None, False
    return r.get(key), bool(r.get("verify", {}).get("ok")) and "error" not in r


def ratios(report: dict) -> dict:
    res, base = report["results"], report["baseline"]
    out: dict = {}
    for scen, key, _label, _hib in METRICS:
        if key in NO_RATIO:
            continue
        b, bok = cell(res, base, scen, key)
        for s in report["systems"]:
            if s == base:
                continue
            v, ok = cell(res, s, scen, key)
            if b is not None and v and bok and ok:
                out.setdefault(f"{scen}.{key}", {})[s] = b / v
    return out


def markdown(report: dict) -> str:
    res, systems, base = report["results"], report["systems"], report["baseline"]
    peers = [s for s in systems if s != base]
    have_base = base in systems
    lines = []
    env = report["environment"]
    lines.append(f"# Awa benchmark — {report['started']}")
    lines.append("")
    lines.append(
        f"PostgreSQL {env['server_version']} · synchronous_commit={env['synchronous_commit']} · "
        f"fsync={env['fsync']} · autovacuum={env['autovacuum']} · {env['cpus']} CPUs · "
        f"Python {env['python']}"
    )
    lines.append("")
    lines.append(
        f"N: single={report['params']['single_jobs']}, bulk/drain={report['params']['jobs']}, "
        f"latency={report['params']['latency_rate']:g}/s "
        f"for {report['params']['latency_seconds']:g}s; "
        f"worker concurrency {CONCURRENCY}"
    )
    lines.append("")
    vers = ", ".join(f"{s} {report['versions'].get(s, '?')}" for s in systems)
    lines.append(f"Versions: {vers}")
    lines.append("")
    head = ["metric", *systems]
    if have_base:
        head += [f"{base}/{p}" for p in peers]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    rat = report["ratios"]
    for scen, key, label, hib in METRICS:
        if scen not in report["scenarios"]:
            continue
        row = [label + ("" if hib else " (lower is better)")]
        for s in systems:
            r = res.get(s, {}).get(scen)
            if s in report["skipped"]:
                row.append("skipped")
            elif not r:
                row.append("–")
            elif "error_only" in r:
                row.append("error")
            else:
                v, ok = cell(res, s, scen, key)
                text = f"{v:.0%}" if key == "ceiling_fraction" and v is not None else fmt(v)
                row.append(text + ("" if ok else " ✗"))
        if have_base:
            for p in peers:
                v = rat.get(f"{scen}.{key}", {}).get(p)
                row.append(f"{v:.2f}×" if v is not None else "–")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Every figure is verified from the database afterwards (each job completed exactly "
        "once, nothing left queued or running; inserts: exactly N distinct jobs queued); "
        "✗ marks one that did not verify (see `verify.problems` / `error` in latest.json)."
    )
    if have_base:
        lines.append(
            f"Ratios are {base} ÷ peer of the raw figure: >1 is better for jobs/s, "
            "<1 is better for CPU, WAL and latency."
        )
    if CEILING in systems:
        lines.append(
            f"`{CEILING}` is the ceiling: the fewest statements PostgreSQL allows for an "
            "insert → claim → complete cycle (bench/systems/rawsql.py); each system's drain "
            "rate is also shown as a share of it. WAL bytes are "
            "`pg_wal_lsn_diff` over the drain (go → workers stopped), divided by N."
        )
    rounds = []
    for s in systems:
        per_round = (res.get(s, {}).get("drain-1w") or {}).get("round_jobs_per_s") or []
        if len(per_round) > 1:
            rounds.append(f"{s} " + " / ".join(fmt(v) for v in per_round))
    if rounds:
        lines.append(
            f"Drains ran in {report['params']['rounds']} interleaved rounds (every system once "
            "per round); each drain figure is from the round of median jobs/s. drain 1w, jobs/s "
            "per round: " + "; ".join(rounds) + "."
        )
    notes = []
    for s in systems:
        for scen in DRAINS:
            r = res.get(s, {}).get(scen) or {}
            busy = r.get("other_db_cpu_s")
            if busy and busy > max(0.2, 0.1 * (r.get("seconds") or 0)):
                notes.append(
                    f"- {s} / {scen}: other databases' backends used {busy:.1f} CPU s during "
                    f"the {r['seconds']:.1f} s drain; its WAL figure includes their writes"
                )
            held = r.get("oldest_xact")
            if held and held["age_s"] > max(1.0, r.get("seconds") or 0):
                notes.append(
                    f"- {s} / {scen}: a transaction in database {held['db']} held an XID "
                    f"for the whole drain ({held['age_s']:.0f} s): dead rows could not be "
                    "pruned meanwhile, which slows claims"
                )
    for s, why in report["skipped"].items():
        notes.append(f"- **{s} skipped**: {why}")
    for s in systems:
        for scen, r in res.get(s, {}).items():
            if r.get("error_only"):
                notes.append(f"- {s} / {scen}: error: {r['error_only']}")
            elif r.get("error"):
                notes.append(f"- {s} / {scen}: {r['error']}")
            elif not r.get("verify", {}).get("ok", False):
                why = r.get("verify", {}).get("problems")
                notes.append(f"- {s} / {scen}: verification failed: {why}")
    if notes:
        lines.append("")
        lines += notes
    lines.append("")
    return "\n".join(lines)


# ===========================================================================


def main() -> None:
    args = parse_args(sys.argv[1:])
    if sys.version_info < (3, 11):  # noqa: UP036 - run.py is started by any python
        sys.exit("bench/run.py needs Python >= 3.11")
    ensure_runner()  # re-execs into bench/.venvs/_runner unless already there
    if args.rawsql_async_claim:
        os.environ["BENCH_RAWSQL_CLAIM_COMMIT"] = "off"  # read by systems/rawsql.py

    started = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    logdir = RESULTS / "runs" / stamp
    logdir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    admin = Admin(args.database_url)
    env = admin.server_info()
    env["cpus"] = os.cpu_count()
    env["python"] = platform.python_version()
    env["machine"] = platform.machine()
    print(
        f"PostgreSQL {env['server_version']}  synchronous_commit={env['synchronous_commit']}  "
        f"fsync={env['fsync']}  autovacuum={env['autovacuum']}  cpus={env['cpus']}",
        flush=True,
    )
    if env["synchronous_commit"] != "on":
        sys.exit("synchronous_commit is not 'on' on this server; refusing to benchmark")
    postmaster = admin.postmaster_pid()
    if not postmaster:
        print("[warn] cannot see the postmaster in /proc: Postgres CPU will not be measured")

    report: dict = {
        "started": started,
        "environment": env,
        "params": {
            "jobs": args.jobs,
            "single_jobs": args.single_jobs,
            "latency_seconds": args.latency_seconds,
            "latency_rate": args.latency_rate,
            "concurrency": CONCURRENCY,
            "quick": args.quick,
            "rounds": args.rounds,
            "rawsql_claim_commit": "off" if args.rawsql_async_claim else "on",
        },
        "systems": args.systems,
        "scenarios": args.scenarios,
        "baseline": args.baseline,
        "versions": {},
        "schema_setup": {},
        "skipped": {},
        "results": {},
    }

    drivers: dict[str, Driver] = {}
    for name in args.systems:
        try:
            venv = ensure_venv(name, args, logdir)
            drv = Driver(name, venv, db_url(args.database_url, SYSTEMS[name]["db"]), logdir)
            try:
                report["versions"][name] = drv.call("version", timeout=120)["version"]
            except DriverError as e:
                tail = drv.log.read_text().strip().splitlines()[-3:] if drv.log.exists() else []
                raise Skip(f"driver does not import: {e}\n    " + "\n    ".join(tail)) from e
            drivers[name] = drv
            print(f"[setup] {name} {report['versions'][name]} ready", flush=True)
        except Skip as e:
            report["skipped"][name] = str(e)
            print(f"[skip] {name}: {e}", flush=True)

    drain_rounds: dict[tuple[str, str], list[dict]] = {}  # (system, drain) -> its rounds
    for scen in args.scenarios:
        rounds = args.rounds if scen in DRAINS else 1
        for rnd, name in ((r, n) for r in range(rounds) for n in drivers):
            drv, db = drivers[name], SYSTEMS[name]["db"]
            label = f"{scen}#{rnd + 1}" if rounds > 1 else scen
            print(f"[run] {label:<13} {name:<14}", end=" ", flush=True)
            t0 = time.time()
            try:
                if scen == "insert-single":
                    r = sc_insert(drv, admin, db, "insert-single", args.single_jobs)
                elif scen == "insert-bulk":
                    r = sc_insert(drv, admin, db, "insert-bulk", args.jobs)
                elif scen == "drain-1w":
                    r = sc_drain(drv, admin, db, postmaster, args.jobs, 1)
                elif scen == "drain-2w":
                    r = sc_drain(drv, admin, db, postmaster, args.jobs, 2)
                else:
                    r = sc_latency(
                        drv, admin, db, postmaster, args.latency_rate, args.latency_seconds
                    )
            except Exception as e:  # keep going: one failing system must not kill the run
                r = {"error_only": f"{type(e).__name__}: {e}"}
            if rounds > 1:
                drain_rounds.setdefault((name, scen), []).append(r)
            else:
                report["results"].setdefault(name, {})[scen] = r
            if "error_only" in r:
                summary = "ERROR " + r["error_only"]
            else:
                v = r.get("verify", {})
                if scen == "latency":
                    summary = (
                        f"p50 {fmt(r['p50_ms'])} ms  p95 {fmt(r['p95_ms'])}  p99 {fmt(r['p99_ms'])}"
                    )
                else:
                    summary = f"{fmt(r['jobs_per_s'])} jobs/s"
                    if "worker_cpu_per_1k" in r:
                        summary += (
                            f"  cpu/1k worker {fmt(r['worker_cpu_per_1k'])}s"
                            f" pg {fmt(r['pg_cpu_per_1k'])}s"
                            f"  WAL/job {fmt(r.get('wal_per_job'))} B"
                        )
                summary += (
                    "  verified"
                    if v.get("ok") and "error" not in r
                    else f"  NOT VERIFIED {r.get('error', '')} {v.get('problems')}"
                )
            print(f"{summary}  ({time.time() - t0:.0f}s)", flush=True)

    for name, drv in drivers.items():
        report["schema_setup"][name] = getattr(drv, "setup_info", None)
        for db in (SYSTEMS[name]["db"], SYSTEMS[name]["db"] + "_tpl"):
            if args.keep_dbs and not db.endswith("_tpl"):
                continue
            try:
                admin.drop(db)
            except Exception:
                pass

    for (name, scen), runs in drain_rounds.items():
        report["results"].setdefault(name, {})[scen] = median_round(runs)
    report["elapsed_seconds"] = time.time() - t_start
    add_ceiling(report)
    report["ratios"] = ratios(report)
    md = markdown(report)
    RESULTS.mkdir(exist_ok=True)
    for path in (RESULTS / "latest.json", logdir / "result.json"):
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for path in (RESULTS / "latest.md", logdir / "result.md"):
        path.write_text(md)
    print()
    print(md)
    print(
        f"wrote {RESULTS / 'latest.json'} and latest.md (logs: {logdir}); "
        f"took {report['elapsed_seconds'] / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
