"""Where a drain's CPU goes: the worker process against PostgreSQL, per job.

    python bench/worker_cpu.py                                  # this tree, 100,000 jobs, 3 rounds
    python bench/worker_cpu.py --src old=../old --src new=.   # A/B, alternating, medians
    python bench/worker_cpu.py --rounds 1 --py-spy out.svg      # also a flame graph of the worker

Runs in the dev venv (``.venv/bin/python bench/worker_cpu.py``). Each drain
is a child process started with ``PYTHONPATH=<src>/src``, so one run can
compare two trees under the same conditions: rounds alternate the order
(A B, B A, ...) and the table shows each variant's median. A drain: a fresh
database, --jobs no-op jobs COPYed in and analyzed (untimed), then one worker
process (``AsyncClient``, one queue at concurrency 32, as bench/run.py's
``drain-1w``) runs them until every handler returned and every completion is
written. Measured over that window: the worker's own CPU (``getrusage``, all
its threads) and the CPU of the PostgreSQL backends serving the database
(utime + stime from ``/proc/<pid>/stat``; the backends start with the worker,
so connection set-up is included, a few ms; autovacuum, the WAL writer and
the checkpointer are not). ``--py-spy FILE`` runs the first drain under
``py-spy record`` attached for the drain window only (FILE.svg: a flame
graph; FILE.json: speedscope), which slows that drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUEUE = "bench"
CONCURRENCY = 32
CLK_TCK = os.sysconf("SC_CLK_TCK")


def backend_cpu(db: str) -> dict[int, int]:
    """CPU ticks of each PostgreSQL backend connected to ``db`` (matched by its title)."""
    out: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if not cmd.startswith("postgres:") or f" {db} " not in cmd:
                continue
            s = Path(f"/proc/{d}/stat").read_text()
        except (OSError, UnicodeDecodeError):
            continue
        f = s[s.rfind(")") + 2:].split()
        out[int(d)] = int(f[11]) + int(f[12])
    return out


def start_py_spy() -> subprocess.Popen[bytes] | None:
    """py-spy recording this process (the drain only), if $BENCH_PY_SPY names a file."""
    out = os.environ.get("BENCH_PY_SPY")
    if not out:
        return None
    fmt = "speedscope" if out.endswith(".json") else "flamegraph"
    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid",
                            str(os.getpid()), "--rate", os.environ.get("BENCH_PY_SPY_RATE", "250"),
                            "--format", fmt, "--output", out, "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let it attach before the drain starts
    return spy


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sys_self() -> tuple[float, int, int]:
    """Kernel CPU seconds, voluntary and involuntary context switches of this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


async def drain(admin: str, db: str, jobs: int) -> dict[str, object]:
    """One measured drain in this process (the child)."""
    from dataclasses import dataclass

    import asyncpg

    import awa

    @dataclass
    class BenchJob:  # as bench/systems/awa.py
        seq: int
        sent_at: float = 0.0

    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{db}"')
    await conn.close()
    url = admin.rsplit("/", 1)[0] + "/" + db
    await awa.migrate(url)
    producer = awa.AsyncClient(url, max_connections=2)
    for start in range(0, jobs, 20_000):
        await producer.enqueue_many_copy(
            [BenchJob(seq=s) for s in range(start, min(jobs, start + 20_000))], queue=QUEUE)
    await producer.close()
    conn = await asyncpg.connect(url)
    await conn.execute("VACUUM ANALYZE awa.jobs")
    await conn.close()

    client = awa.AsyncClient(url, max_connections=10)
    handled = 0
    done = asyncio.Event()

    @client.task(BenchJob, queue=QUEUE)
    async def handle(job):
        nonlocal handled
        handled += 1
        if handled == jobs:
            done.set()

    spy = start_py_spy()
    prof = None
    if os.environ.get("BENCH_CPROFILE"):  # CPU time (not wall) per function, drain only
        import cProfile

        prof = cProfile.Profile(time.thread_time)
        prof.enable()
    base = backend_cpu(db)
    c0, t0, k0 = cpu_self(), time.perf_counter(), sys_self()
    await client.start(queues=[(QUEUE, CONCURRENCY)])
    await done.wait()
    runtime = client._runtime
    assert runtime is not None
    await runtime.completer.drain()
    wall = time.perf_counter() - t0
    worker = cpu_self() - c0
    k1 = sys_self()
    end = backend_cpu(db)
    pg = sum(v - base.get(pid, 0) for pid, v in end.items()) / CLK_TCK
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["BENCH_CPROFILE"])
    if spy is not None:  # our own child: stop it, it writes its file
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    await client.shutdown(timeout_ms=5000)
    await client.close()
    conn = await asyncpg.connect(url)
    completed = await conn.fetchval(
        "SELECT count(*) FROM awa.jobs_all WHERE queue = $1 AND state = 'completed'", QUEUE)
    await conn.close()
    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await conn.close()
    return {"jobs": jobs, "completed": completed, "seconds": wall, "jobs_per_s": jobs / wall,
            "worker_us": worker / jobs * 1e6, "pg_us": pg / jobs * 1e6,
            "worker_sys_us": (k1[0] - k0[0]) / jobs * 1e6,
            "switches_per_1k": [(k1[1] - k0[1]) / jobs * 1e3, (k1[2] - k0[2]) / jobs * 1e3],
            "awa": os.path.dirname(os.path.dirname(awa.__file__))}


def child(src: str, args: argparse.Namespace, py_spy: str | None) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve() / "src"))
    env.pop("BENCH_PY_SPY", None)
    if py_spy:
        env.update(BENCH_PY_SPY=str(Path(py_spy).resolve()), BENCH_PY_SPY_RATE=str(args.rate))
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--role-drain",
           "--url", args.url, "--db", args.db, "--jobs", str(args.jobs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"drain failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"), help="admin URL")
    p.add_argument("--db", default="bench_worker_cpu")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--src", action="append", default=[],
                   help="NAME=PATH of a source tree (repeatable; default: this tree)")
    p.add_argument("--py-spy", help="profile the first drain into this file (.svg or .json)")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--role-drain", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role_drain:
        print(json.dumps(asyncio.run(drain(args.url, args.db, args.jobs))), flush=True)
        return
    srcs = [tuple(s.split("=", 1)) for s in args.src] or [("this", str(ROOT))]
    results: dict[str, list[dict[str, object]]] = {name: [] for name, _ in srcs}
    spy = args.py_spy
    for r in range(args.rounds):
        order = srcs if r % 2 == 0 else srcs[::-1]
        for name, src in order:
            res = child(src, args, spy)
            spy = None
            results[name].append(res)
            print(f"round {r + 1} {name:>8}: {res['jobs_per_s']:8,.0f} jobs/s  worker "
                  f"{res['worker_us']:5.1f} µs/job (sys {res['worker_sys_us']:4.1f})  "
                  f"postgres {res['pg_us']:5.1f} µs/job  "
                  f"completed {res['completed']:,}", flush=True)
    print("\n| variant | jobs/s | worker CPU µs/job | Postgres CPU µs/job | rounds |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in results.items():
        med = {k: statistics.median(float(x[k]) for x in rs)  # type: ignore[arg-type]
               for k in ("jobs_per_s", "worker_us", "pg_us")}
        print(f"| {name} | {med['jobs_per_s']:,.0f} | {med['worker_us']:.1f} | "
              f"{med['pg_us']:.1f} | {len(rs)} |")


if __name__ == "__main__":
    main()
