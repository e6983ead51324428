#!/usr/bin/env python3
"""Scheduled jobs at volume: does promotion keep up? (issue 9, item 5)

    python bench/scheduled.py                          # 1,000,000 jobs due at 2,000/s
    python bench/scheduled.py --jobs 20000 --rate 2000 # smoke (10 s of due jobs)

A fresh database and one idle Awa worker process (bench/systems/awa.py,
concurrency 32, Awa's default settings: promotion every 250 ms by the leader,
at most 5,000 jobs per statement).  Then --jobs no-op jobs are inserted in
the ``scheduled`` state (plain SQL, in chunks, in due order) with run_at
spread evenly from start + --lead seconds at --rate per second (the defaults:
from now+30 s over 500 s).  Every chunk lands long before its first job is
due.  The run ends when every job has run.

Lateness of a job = ``attempted_at - run_at`` from awa.jobs_done: the time
from coming due to being claimed (promotion and dispatch together).  Reported:
p50/p90/p99/p99.9/max overall and per 10 s of due time (span/20 for short
runs), and the number of due jobs still waiting for promotion, sampled every
second.  Writes
bench/results/scheduled.md, scheduled.json and scheduled_lateness.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DB = "bench_sched"
CHUNK = 50_000
TARGET_P99_MS = 500.0

INSERT = """
INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at)
SELECT 'bench_job', 'bench', jsonb_build_object('seq', g, 'sent_at', 0), 'scheduled', 2, 25,
       %(t0)s::timestamptz + make_interval(secs => g / %(rate)s::float8)
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g
"""
LATENESS = """
SELECT count(*), percentile_cont(ARRAY[0.5, 0.9, 0.99, 0.999]) WITHIN GROUP (ORDER BY l), max(l)
FROM (SELECT extract(epoch FROM attempted_at - run_at) * 1000 AS l FROM awa.jobs_done
      WHERE queue = 'bench' AND state = 'completed') s
"""
WINDOWS = """
SELECT w * %(width)s, count(*), percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY l),
       max(l)
FROM (SELECT floor(extract(epoch FROM run_at - %(t0)s::timestamptz) / %(width)s)::int AS w,
             extract(epoch FROM attempted_at - run_at) * 1000 AS l
      FROM awa.jobs_done WHERE queue = 'bench' AND state = 'completed') s
GROUP BY w ORDER BY w
"""
DUE = """
SELECT extract(epoch FROM now() - %(t0)s::timestamptz)::float8,
       count(*) FILTER (WHERE state = 'scheduled' AND run_at <= now()),
       count(*) FILTER (WHERE state = 'available'),
       count(*) FILTER (WHERE state = 'scheduled')
FROM awa.jobs
"""


def promote_settings(drv) -> dict:
    code = ("import json; from awa.worker.config import RuntimeConfig as C; "
            "from awa.maintenance import services as s; c = C(); "
            "print(json.dumps({'promote_interval_ms': c.promote_interval.total_seconds() * 1000,"
            " 'promote_batch': getattr(s, 'PROMOTE_BATCH', None),"
            " 'poll_interval_ms': c.poll_interval.total_seconds() * 1000}))")
    try:
        out = subprocess.run([drv.py, "-P", "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return {}


def plot(windows: list, samples: list, width: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, (a1, a2) = plt.subplots(2, 1, figsize=(9, 7), dpi=100, sharex=True)
    t = [w["due_s"] for w in windows]
    a1.plot(t, [w["p99_ms"] for w in windows], ".-", color="tab:red", label="p99")
    a1.plot(t, [w["p50_ms"] for w in windows], ".-", color="tab:blue", label="p50")
    a1.plot(t, [w["max_ms"] for w in windows], ".:", color="tab:gray", label="max")
    a1.axhline(TARGET_P99_MS, color="black", linestyle="--", linewidth=0.8, label="p99 target")
    a1.set_title(f"Lateness (claimed − due) per {width:g} s of due time")
    a1.set_ylabel("ms")
    a1.set_ylim(bottom=0)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    samples = [s for s in samples if s["t"] > -5]
    a2.plot([s["t"] for s in samples], [s["due_waiting"] for s in samples], ".-",
            color="tab:red", label="due, not yet promoted")
    a2.plot([s["t"] for s in samples], [s["available"] for s in samples], ".-",
            color="tab:blue", label="available (promoted, not claimed)")
    a2.set_title("Backlog in awa.jobs, sampled every second")
    a2.set_xlabel("seconds since the first job came due")
    a2.set_ylabel("jobs")
    a2.set_ylim(bottom=0)
    a2.grid(alpha=0.3)
    a2.legend(fontsize=8)
    f.tight_layout()
    f.savefig(path)
    plt.close(f)


def main() -> None:
    sys.path.insert(0, str(HERE))
    import benchtools as tools

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=1_000_000, help="scheduled jobs (1,000,000)")
    p.add_argument("--rate", type=float, default=2000.0, help="jobs coming due per second (2000)")
    p.add_argument("--lead", type=float, default=30.0, help="seconds until the first is due (30)")
    tools.add_common_args(p)
    args = p.parse_args()
    tools.bootstrap(__file__)
    import psycopg

    bench = tools.bench
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    logs = tools.logdir("scheduled")
    admin = tools.admin_for(args, [DB])
    env = tools.environment(admin)
    print(tools.env_line(env), flush=True)
    drv = tools.awa_driver(args, DB, logs)
    settings = promote_settings(drv)
    span = args.jobs / args.rate
    width = 10.0 if span >= 200 else max(0.5, span / 20)  # seconds of due time per window
    samples: list[dict] = []
    info: dict = {}
    try:
        bench.fresh_db(drv, admin, DB)
        conn = psycopg.connect(drv.url, autocommit=True)
        t0 = conn.execute("SELECT now() + make_interval(secs => %s)", (args.lead,)).fetchone()[0]
        stop = threading.Event()

        def sampler() -> None:
            with psycopg.connect(drv.url, autocommit=True) as c:
                while not stop.wait(1.0):
                    t, due, avail, sched = c.execute(DUE, {"t0": t0}).fetchone()
                    samples.append({"t": t, "due_waiting": due, "available": avail,
                                    "scheduled": sched})

        def insert() -> int:
            t_ins = time.monotonic()
            for lo in range(0, args.jobs, CHUNK):
                hi = min(args.jobs, lo + CHUNK) - 1
                conn.execute(INSERT, {"t0": t0, "rate": args.rate, "lo": lo, "hi": hi})
                print(f"  inserted {hi + 1:,}/{args.jobs:,} "
                      f"({time.monotonic() - t_ins:.0f}s)", flush=True)
            info["insert_seconds"] = time.monotonic() - t_ins
            conn.execute("ANALYZE awa.jobs")
            left = conn.execute("SELECT extract(epoch FROM %s::timestamptz - now())::float8",
                                (t0,)).fetchone()[0]
            info["first_due_after_insert_s"] = left
            print(f"[sched] {args.jobs:,} jobs scheduled from now+{args.lead:g}s over "
                  f"{span:,.0f}s; inserting took {info['insert_seconds']:.0f}s, the first is "
                  f"due in {left:.0f}s", flush=True)
            threading.Thread(target=sampler, daemon=True).start()
            return args.jobs

        procs = [drv.spawn("worker", "--concurrency", "32")]
        try:
            run = bench.run_workers(drv, procs, admin, DB, admin.postmaster_pid(), 0,
                                    timeout=args.lead + span + 300, between=insert)
        finally:
            stop.set()
            for pr in procs:
                pr.kill()
        run.pop("results", None)
        n, qs, mx = conn.execute(LATENESS).fetchone()
        windows = [{"due_s": w, "n": c, "p50_ms": q[0], "p99_ms": q[1], "max_ms": m}
                   for w, c, q, m in conn.execute(WINDOWS, {"t0": t0, "width": width}).fetchall()]
        conn.close()
        verify = bench.verify(drv, admin, DB, completed=args.jobs, handled=run["handled"])
    finally:
        if not args.keep_db:
            for db in (DB, DB + "_tpl"):
                admin.drop(db)
    qs = qs or [None] * 4
    lat = {"n": n, "p50_ms": qs[0], "p90_ms": qs[1], "p99_ms": qs[2], "p999_ms": qs[3],
           "max_ms": mx}
    tail = windows[-max(1, len(windows) // 5):]
    head = windows[: max(1, len(windows) // 5)]
    due_max = max((s["due_waiting"] for s in samples), default=None)
    kept_up = (lat["p99_ms"] is not None and lat["p99_ms"] < TARGET_P99_MS
               and verify["ok"] and "error" not in run)
    rep = {"started": started, "environment": env, "jobs": args.jobs, "rate": args.rate,
           "lead_s": args.lead, "window_s": width, "settings": settings, "insert": info,
           "lateness": lat,
           "windows": windows, "samples": samples, "run": run, "verify": verify,
           "kept_up": kept_up, "max_due_waiting": due_max,
           "tail_p99_ms": max((w["p99_ms"] for w in tail), default=None),
           "head_p99_ms": max((w["p99_ms"] for w in head), default=None)}
    png = tools.RESULTS / "scheduled_lateness.png"
    plot(windows, samples, width, png)
    fmt = tools.fmt
    md = [f"# Awa scheduled jobs at volume — {started}", "", tools.env_line(env), "",
          f"{args.jobs:,} jobs scheduled to come due at {args.rate:,.0f}/s (from start + "
          f"{args.lead:g} s over {span:,.0f} s), one worker process (concurrency 32) with Awa's "
          f"defaults: promotion every {fmt(settings.get('promote_interval_ms'))} ms, up to "
          f"{fmt(settings.get('promote_batch'))} jobs per statement; dispatcher poll "
          f"{fmt(settings.get('poll_interval_ms'))} ms, woken by NOTIFY on promotion.", "",
          "| lateness (claimed − due) | ms |", "|---|---:|"]
    for k, label in (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"),
                     ("p999_ms", "p99.9"), ("max_ms", "max")):
        md.append(f"| {label} | {fmt(lat[k])} |")
    md += ["", f"- promotion kept up (p99 < {TARGET_P99_MS:.0f} ms, every job ran exactly "
           f"once): **{'yes' if kept_up else 'NO'}**",
           f"- worst {width:g}-second window p99: first fifth {fmt(rep['head_p99_ms'])} ms, "
           f"last fifth {fmt(rep['tail_p99_ms'])} ms",
           f"- most due jobs waiting for promotion at one sample: {fmt(due_max)}",
           f"- inserting took {info.get('insert_seconds', 0):.0f} s; the first job came due "
           f"{info.get('first_due_after_insert_s', 0):.0f} s after the last insert",
           f"- verified from the database: {'yes' if verify['ok'] else verify['problems']}",
           "", f"![{png.name}]({png.name})", ""]
    md = "\n".join(md)
    tools.write_report("scheduled", rep, md)
    print(f"wrote {tools.RESULTS / 'scheduled.md'}, scheduled.json and {png.name} (logs: {logs})")


if __name__ == "__main__":
    main()
