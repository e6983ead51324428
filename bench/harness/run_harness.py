#!/usr/bin/env python3
"""One command: the postgresql-job-queue-benchmarking harness for awa, awa-pg
and procrastinate, natively (no docker), side by side.

    python bench/harness/run_harness.py  # everything at --scale 0.7 (~40 min on 2 cores)
    python bench/harness/run_harness.py --cells peak   # one group
    python bench/harness/run_harness.py --harness-dir PATH --scale 0.5
    AWA_HARNESS_DIR=PATH python bench/harness/run_harness.py

What it does:
1. Uses the harness clone given by ``--harness-dir PATH`` (or
   ``$AWA_HARNESS_DIR``; an error when that is not a clone), else
   bench/.harness/pqjb, cloning it there first from ``--harness-url`` (or
   ``$AWA_HARNESS_URL``: a URL or a local mirror; GitHub by default) without
   its results/.
2. Creates the venvs under bench/.venvs/harness-*: runner (the harness's own
   deps, Python >= 3.12), awa (this repo, ``pip install <repo>``), awa-pg
   (``awa-pg`` from PyPI), procrastinate (the harness's pin).
3. initdb's and starts a private PostgreSQL 15 cluster (bench/.harness/pg,
   port 15555, the harness's postgres.conf, synchronous_commit=on, loopback
   only), so the chaos cells may stop and start it; the machine's main
   cluster is never touched.
4. Runs each cell (bench.py run) through harness_driver.py for the three
   systems in turn, each in a freshly created database.
5. Collects summary.json / manifest.json / plots of every cell under
   bench/results/harness/ and writes SUMMARY.md, results.json, results.csv
   and overview plots. Paths in what it keeps are made machine-independent
   (repository-relative, ``<harness-clone>``, ``~``): see `scrub_paths`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BENCH = REPO / "bench"
VENVS = BENCH / ".venvs"
DOT_HARNESS = BENCH / ".harness"
GITHUB = "https://github.com/hardbyte/postgresql-job-queue-benchmarking"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SYSTEMS = ["awa", "awa-pg", "procrastinate"]


def log(msg: str) -> None:
    print(f"[run_harness {datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


# ------------------------------------------------------------------- cells


def cells(scale: float) -> list[dict]:
    """The harness's cells, with phase lengths multiplied by ``scale``.

    scale=1 gives the lengths in NOTES.md's table (already much shorter than the
    harness's own); the committed run used the default 0.7.  Every phase keeps
    its type and order.
    """

    def d(seconds: float) -> str:
        return f"{max(5, round(seconds * scale))}s"

    def phases(*specs: tuple[str, str, float]) -> list[str]:
        out = []
        for label, kind, secs in specs:
            out += ["--phase", f"{label}={kind}:{d(secs)}"]
        return out

    def pressure_cell(name: str, stress: tuple[str, str, float], *, recovery: float = 25,
                      rate: str = "{pressure_rate}", workers: int = 32) -> dict:
        """Warm up, a clean phase, the stress phase, then recovery."""
        stages = (("warmup", "warmup", 10), ("clean_1", "clean", 15), stress,
                  ("recovery_1", "clean", recovery))
        return dict(name=f"pressure_{name}", group="pressure",
                    args=[*phases(*stages), "--producer-rate", rate,
                          "--worker-count", str(workers)])

    def chaos_cell(name: str, faults: list[tuple[str, str, float]], *,
                   rate: str = "{chaos_rate}", replicas: int = 1) -> dict:
        """Warm up, a clean baseline, the fault phases, then recovery."""
        stages = (("warmup", "warmup", 10), ("baseline", "clean", 20), *faults,
                  ("recovery", "clean", 25))
        return dict(name=f"chaos_{name}", group="chaos",
                    args=[*phases(*stages), "--producer-rate", rate,
                          "--replicas", str(replicas)])

    period = f"{max(5, round(10 * scale))}s"
    return [
        # Phase A peak-throughput cell: depth-target producer keeps 4000 jobs
        # available, so completion rate is the ceiling.  W=32 (the 2-core box).
        dict(
            name="peak_throughput",
            group="peak",
            args=[
                *phases(("warmup", "warmup", 10), ("clean", "clean", 45)),
                "--producer-mode",
                "depth-target",
                "--producer-rate",
                "50000",
                "--target-depth",
                "4000",
                "--worker-count",
                "32",
            ],
        ),
        # Phase B chaos: 1 replica for the Postgres-level scenarios, 2 for kills.
        # Phase B chaos cells: warm up, a clean baseline, the fault, recovery.
        chaos_cell("postgres_restart", [("restart", "postgres-restart", 20)]),
        chaos_cell("pg_backend_kill", [("kills", "pg-backend-kill(rate=2)", 20)]),
        chaos_cell("pool_exhaustion", [("exhaustion", "pool-exhaustion(idle_conns=300)", 20)]),
        chaos_cell("crash_recovery", [("kill", "kill-worker(instance=0)", 15),
                                      ("restart", "start-worker(instance=0)", 15)],
                   rate="{chaos_rate_half}", replicas=2),
        chaos_cell("repeated_kills",
                   [("repeated", f"repeated-kill(instance=0,period={period})", 30)],
                   rate="{chaos_rate_half}", replicas=2),
        # Phase C pressure cells (fixed-rate producer for every system).
        pressure_cell("idle_in_tx", ("idle_1", "idle-in-tx", 35)),
        pressure_cell("sustained_high_load", ("pressure_1", "high-load", 35)),
        pressure_cell("active_readers", ("readers_1", "active-readers", 35)),
        pressure_cell("event_burst", ("pressure_1", "high-load", 45), recovery=35,
                      rate="{burst_rate}", workers=64),
        # Not in the default set: chaos_postgres_restart at the harness's own
        # lengths (Postgres down 30 s), to see what happens past Awa's ~8 s
        # completion-retry budget.  `--cells extra --systems awa --scale 1`.
        dict(
            name="chaos_postgres_restart_long",
            group="extra",
            args=[
                "--phase",
                "warmup=warmup:30s",
                "--phase",
                "baseline=clean:60s",
                "--phase",
                "restart=postgres-restart:60s",
                "--phase",
                "recovery=clean:60s",
                "--producer-rate",
                "{chaos_rate}",
                "--replicas",
                "1",
            ],
        ),
        # long_horizon: same phase sequence, minutes -> seconds-scale.
        dict(
            name="long_horizon",
            group="long",
            args=[
                *phases(
                    ("warmup", "warmup", 10),
                    ("clean_1", "clean", 15),
                    ("idle_1", "idle-in-tx", 30),
                    ("recovery_1", "recovery", 30),
                    ("idle_2", "idle-in-tx", 30),
                ),
                "--producer-rate",
                "{pressure_rate}",
                "--worker-count",
                "32",
            ],
        ),
    ]


# ------------------------------------------------------------------- setup


def ensure_harness(path: Path | None, url: str) -> Path:
    """The harness clone: ``path`` (--harness-dir / $AWA_HARNESS_DIR) when given,
    else bench/.harness/pqjb, cloned there from ``url`` on first use."""
    if path is not None:
        if not path.is_dir():
            raise SystemExit(f"--harness-dir / $AWA_HARNESS_DIR: {path} does not exist "
                             f"(give a clone of {GITHUB}, or neither to clone it into "
                             f"{DOT_HARNESS / 'pqjb'})")
        if not (path / "bench_harness").is_dir():
            raise SystemExit(f"--harness-dir / $AWA_HARNESS_DIR: {path} is not a clone of "
                             f"postgresql-job-queue-benchmarking (no bench_harness/ in it)")
        return path.resolve()
    dest = DOT_HARNESS / "pqjb"
    if (dest / "bench_harness").is_dir():
        return dest
    DOT_HARNESS.mkdir(parents=True, exist_ok=True)
    (DOT_HARNESS / ".gitignore").write_text("*\n")
    log(f"cloning the harness from {url} into {dest}")
    try:
        sh(["git", "clone", "-q", "--no-checkout", url, str(dest)])
    except subprocess.CalledProcessError:
        raise SystemExit(f"could not clone the harness from {url}: give a clone with "
                         "--harness-dir / $AWA_HARNESS_DIR, or another source with "
                         "--harness-url / $AWA_HARNESS_URL") from None
    names = subprocess.run(
        ["git", "-C", str(dest), "ls-tree", "-r", "--name-only", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    wanted = [n for n in names if n and not n.startswith("results/")]
    for i in range(0, len(wanted), 200):
        sh(["git", "-C", str(dest), "checkout", "HEAD", "--", *wanted[i : i + 200]])
    return dest


def find_python312() -> str:
    for cand in ("python3.13", "python3.12"):
        p = shutil.which(cand)
        if p:
            return p
    for p in sorted(Path.home().glob(".pyenv/versions/3.1[23]*/bin/python3")):
        return str(p)
    if sys.version_info >= (3, 12):
        return sys.executable
    raise SystemExit("the harness needs Python >= 3.12 for its runner venv")


def ensure_venv(name: str, python: str, requirements: list[str], *, reinstall: bool) -> Path:
    venv = VENVS / f"harness-{name}"
    marker = venv / ".harness-requirements"
    want = json.dumps(requirements)
    if not reinstall and marker.is_file() and marker.read_text() == want:
        return venv
    log(f"creating venv {venv} ({' '.join(requirements)})")
    if venv.exists():
        shutil.rmtree(venv)
    sh([python, "-m", "venv", str(venv)])
    sh([str(venv / "bin" / "pip"), "install", "-q", *requirements])
    marker.write_text(want)
    return venv


def ensure_venvs(harness: Path, awa_source: Path, reinstall: bool) -> None:
    VENVS.mkdir(parents=True, exist_ok=True)
    py312 = find_python312()
    ensure_venv(
        "runner",
        py312,
        ["psycopg[binary]>=3.2", "matplotlib>=3.9", "pandas>=2.2", "numpy>=2.0", "pydantic>=2"],
        reinstall=reinstall,
    )
    # Our awa: a plain (non-editable) install, so the run measures one fixed tree.
    ensure_venv("awa", sys.executable, [str(awa_source)], reinstall=True)
    ensure_venv("awa-pg", sys.executable, ["awa-pg==0.6.9"], reinstall=reinstall)
    pins = ["procrastinate==3.8.1", "psycopg[binary]==3.3.3"]
    ensure_venv("procrastinate", py312, pins, reinstall=reinstall)


class PrivateCluster:
    """A throwaway PostgreSQL 15 cluster the chaos cells may stop and start."""

    def __init__(self, data: Path, port: int, conf: Path) -> None:
        self.data = data
        self.port = port
        self.conf = conf
        self.runas = "postgres" if os.geteuid() == 0 else ""

    def _cmd(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.runas, "--", *argv] if self.runas else argv

    def init(self) -> None:
        if self.data.exists():
            self.stop()
            shutil.rmtree(self.data)
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.data.mkdir()
        if self.runas:
            shutil.chown(self.data, self.runas, self.runas)
            for parent in self.data.parents:  # postgres must reach its data directory
                if parent == Path("/"):
                    break
                os.chmod(parent, os.stat(parent).st_mode | 0o001)
        sh(
            self._cmd(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "bench",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            stdout=subprocess.DEVNULL,
        )
        lines = []
        for line in self.conf.read_text().splitlines():
            if line.strip().startswith("listen_addresses"):
                continue
            lines.append(line)
        lines += [
            "",
            "# run_harness.py overrides: loopback only, private port, sockets in the data dir",
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.data}'",
            "synchronous_commit = on",
        ]
        # HARNESS_PG_EXTRA_CONF=file: settings appended for a diagnostic run (for
        # example auto_explain); published runs leave it unset.
        extra = os.environ.get("HARNESS_PG_EXTRA_CONF")
        if extra:
            lines += ["", f"# {extra}", *Path(extra).read_text().splitlines()]
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n" + "\n".join(lines) + "\n")

    def start(self) -> None:
        sh(
            self._cmd(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    str(self.data / "server.log"),
                    "start",
                ]
            ),
            stdout=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        subprocess.run(
            self._cmd([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


# ------------------------------------------------------------------- running


def run_cell(
    cell: dict,
    *,
    harness: Path,
    cluster: PrivateCluster,
    systems: list[str],
    rates: dict,
    raw_dir: Path,
    logs: Path,
    timeout_s: float,
    sample_every: int,
) -> dict:
    args = [a.format(**rates) for a in cell["args"]]
    argv = [
        str(VENVS / "harness-runner" / "bin" / "python"),
        str(HERE / "harness_driver.py"),
        "--harness",
        str(harness),
        "--results",
        str(raw_dir),
        "--",
        "run",
        "--systems",
        ",".join(systems),
        "--fast",
        "--skip-build",
        "--sample-every",
        str(sample_every),
        *args,
    ]
    env = {
        **os.environ,
        "HARNESS_PG_PORT": str(cluster.port),
        "HARNESS_PG_BIN": str(PG_BIN),
        "HARNESS_PG_DATA": str(cluster.data),
        "HARNESS_PG_RUNAS": cluster.runas,
        "HARNESS_VENVS": str(VENVS),
        "HARNESS_ADAPTER_DIR": str(HERE),
        "HARNESS_CELL": cell["name"],
        # Every adapter uses its bulk insert path, 128 rows max per call.
        "PRODUCER_BATCH_MAX": "128",
        "MPLBACKEND": "Agg",
    }
    log_path = logs / f"{cell['name']}.log"
    log(f"cell {cell['name']}: {' '.join(args)}")
    started = time.time()
    with open(log_path, "w") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        proc = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(harness),
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = "timeout"
    elapsed = time.time() - started
    text = log_path.read_text(errors="replace")
    run_dir = None
    for line in text.splitlines():
        if "[native-driver] run_dir=" in line:
            run_dir = line.split("run_dir=", 1)[1].strip()
    log(f"cell {cell['name']}: rc={rc} in {elapsed:.0f}s -> {run_dir}")
    # Always make sure Postgres is up for the next cell.
    if (
        subprocess.run(
            cluster._cmd([str(PG_BIN / "pg_ctl"), "-D", str(cluster.data), "status"]),
            stdout=subprocess.DEVNULL,
        ).returncode
        != 0
    ):
        cluster.start()
    return {
        "cell": cell["name"],
        "group": cell["group"],
        "rc": rc,
        "elapsed_s": round(elapsed, 1),
        "run_dir": run_dir,
        "args": args,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    env_dir = os.environ.get("AWA_HARNESS_DIR")
    ap.add_argument(
        "--harness-dir", "--harness", dest="harness", type=Path,
        default=Path(env_dir) if env_dir else None,
        help="clone of postgresql-job-queue-benchmarking (default $AWA_HARNESS_DIR, else "
        "bench/.harness/pqjb, cloned on first use)",
    )
    ap.add_argument(
        "--harness-url", default=os.environ.get("AWA_HARNESS_URL") or GITHUB,
        help="where to clone the harness from when there is no clone (default "
        "$AWA_HARNESS_URL, else GitHub); a local mirror works too",
    )
    ap.add_argument("--awa-source", type=Path, default=REPO, help="what to pip install as our awa")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument(
        "--cells",
        default="peak,chaos,pressure,long",
        help="groups (peak, chaos, pressure, long) or cell names, comma-separated",
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=0.7,
        help="multiply every phase length (0.7: the committed run, ~36 min on 2 cores)",
    )
    ap.add_argument(
        "--chaos-rate", type=int, default=200, help="jobs/s offered in 1-replica chaos cells"
    )
    ap.add_argument(
        "--pressure-rate", type=int, default=200, help="jobs/s offered in pressure cells"
    )
    ap.add_argument("--sample-every", type=int, default=2)
    ap.add_argument("--port", type=int, default=15555)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "harness")
    ap.add_argument("--reinstall", action="store_true")
    ap.add_argument("--skip-setup", action="store_true", help="reuse venvs as they are")
    ns = ap.parse_args()

    systems = [s for s in ns.systems.split(",") if s]
    harness = ensure_harness(ns.harness, ns.harness_url)
    if not ns.skip_setup:
        ensure_venvs(harness, ns.awa_source.resolve(), ns.reinstall)
    wanted = set(ns.cells.split(","))
    todo = [c for c in cells(ns.scale) if c["group"] in wanted or c["name"] in wanted]
    rates = {
        "chaos_rate": ns.chaos_rate,
        "chaos_rate_half": max(1, ns.chaos_rate // 2),
        "pressure_rate": ns.pressure_rate,
        "burst_rate": int(ns.pressure_rate * 1.5),
    }

    # Absolute: the driver runs with the harness clone as its cwd, so a relative
    # --out would put the runs inside the clone.
    out = ns.out.resolve()
    raw_dir = out / "runs"
    logs = out / "logs"
    for p in (raw_dir, logs):
        p.mkdir(parents=True, exist_ok=True)
    cluster = PrivateCluster(DOT_HARNESS / "pg", ns.port, harness / "postgres.conf")
    (DOT_HARNESS / ".gitignore").parent.mkdir(parents=True, exist_ok=True)
    (DOT_HARNESS / ".gitignore").write_text("*\n")
    cluster.init()
    cluster.start()
    index_path = out / "run_index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else []
    started = time.time()
    try:
        for cell in todo:
            phase_s = sum(
                int(a.split(":")[-1].rstrip("s")) for a in cell["args"] if "=" in a and ":" in a
            )
            budget = 300 + 2 * phase_s * len(
                systems
            )  # generous: a wedged cell must not eat the run
            entry = run_cell(
                cell,
                harness=harness,
                cluster=cluster,
                systems=systems,
                rates=rates,
                raw_dir=raw_dir,
                logs=logs,
                timeout_s=budget,
                sample_every=ns.sample_every,
            )
            entry.update(
                systems=systems,
                scale=ns.scale,
                rates=rates,
                finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            run_dir = entry.get("run_dir")
            shrink_run_dir(run_dir)
            scrub_files([logs / f"{cell['name']}.log", *text_files(run_dir)], harness)
            if run_dir:
                entry["run_dir"] = scrub_paths(run_dir, harness)
            index = [e for e in index if e["cell"] != cell["name"]] + [entry]
            index_path.write_text(json.dumps(index, indent=2))
    finally:
        cluster.stop()
    log(f"all cells done in {(time.time() - started) / 60:.1f} min")
    sh(
        [
            str(VENVS / "harness-runner" / "bin" / "python"),
            str(HERE / "summarize.py"),
            "--out",
            str(out),
        ]
    )
    return 0


def scrub_paths(text: str, harness: Path) -> str:
    """``text`` with this machine's paths made portable: the harness clone
    becomes ``<harness-clone>``, the repository's own paths repository-relative,
    the home directory ``~``. What is committed under bench/results must not
    name a machine's directories (tests/test_bench_results.py checks)."""
    for path, portable in ((harness.resolve(), "<harness-clone>"), (REPO.resolve(), ""),
                           (Path.home(), "~")):
        prefix = str(path)
        if prefix in ("", "/"):
            continue
        text = text.replace(prefix + "/", f"{portable}/" if portable else "")
        text = re.sub(re.escape(prefix) + r"(?![\w.-])", portable or ".", text)
    return text


def text_files(run_dir: str | None) -> list[Path]:
    """The text files of a run directory (what `scrub_files` rewrites)."""
    if not run_dir:
        return []
    return [p for p in Path(run_dir).rglob("*")
            if p.is_file() and p.suffix in {".json", ".md", ".log", ".txt", ".csv"}]


def scrub_files(paths: list[Path], harness: Path) -> None:
    for path in paths:
        if path.is_file():  # bytes in, bytes out: only the paths change
            text = path.read_bytes().decode(errors="surrogateescape")
            scrubbed = scrub_paths(text, harness)
            if scrubbed != text:
                path.write_bytes(scrubbed.encode(errors="surrogateescape"))


def shrink_run_dir(run_dir: str | None) -> None:
    """Keep what a reader needs in git: gzip raw.csv, drop the harness's HTML
    report (SUMMARY.md and summary.json say the same) and all but four of its
    per-run plots."""
    if not run_dir:
        return
    d = Path(run_dir)
    raw = d / "raw.csv"
    if raw.is_file():
        with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    (d / "index.html").unlink(missing_ok=True)
    keep = {"throughput.png", "claim_p99.png", "dead_tuples.png", "queue_depth.png"}
    for plot in d.glob("plots/*"):  # the rest of the harness's plots: regenerate from raw.csv.gz
        if plot.name not in keep:
            plot.unlink()


if __name__ == "__main__":
    sys.exit(main())
