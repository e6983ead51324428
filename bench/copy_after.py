"""Bulk COPY with and without ``after=``: the plain path must not slow down.

    python bench/copy_after.py --baseline-src DIR [--jobs N] [--rounds R]
                               [--database-url URL]

``--baseline-src``: the ``src`` directory of the checkout to compare with
(e.g. ``git archive main src | tar -x -C ../base``). Each measurement runs in
its own interpreter importing one checkout's ``awa`` (by ``PYTHONPATH``), on
the same database, baseline and this checkout alternating round by round;
medians are reported, with the ratio this/baseline, in
``bench/results/copy_after.md``:

- ``enqueue_many_copy`` of N plain jobs (the binary COPY straight into the
  jobs table), both checkouts: the figure that must not regress;
- ``insert_many_copy`` of N plain jobs (staging COPY), both checkouts;
- this checkout only: the same two calls with ``after=[parent]`` on every
  job (the staged, dependency-aware insert: jobs, edges, one parent lock).

``--mixed K``: instead, mixed calls, both checkouts: every K-th job waits for
the parent (``opts[i] = {"after": [parent]}``), the others for nothing, through
``enqueue_many_copy``, ``insert_many_copy`` and ``insert_many``, each timed
after a small mixed call of the same kind (statements prepared, as in a
running producer); the table is printed with a date, to be added to
``bench/results/copy_after.md`` by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


@dataclass
class Unit:
    seq: int


async def _child(url: str, mode: str, jobs: int) -> float:
    import asyncpg

    import awa

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE awa.jobs, awa.job_dependencies")
    finally:
        await conn.close()
    batch = [Unit(n) for n in range(jobs)]
    async with awa.AsyncClient(url) as client:
        parent = await client.insert(Unit(-1), queue="parents")
        kw: dict[str, object] = {"after": [parent]} if mode.endswith("_after") else {}
        if "_mixed" in mode:
            every = int(mode.rsplit("_", 1)[1])
            kw = {"opts": [{"after": [parent]} if n % every == 0 else None
                           for n in range(jobs)]}
        method = client.enqueue_many_copy if mode.startswith("enqueue") else \
            client.insert_many if mode.startswith("many") else client.insert_many_copy
        if "_mixed" in mode:  # a producer's steady state: its statements already prepared
            await method(batch[:every * 2], queue="warm",
                         opts=[{"after": [parent]} if n % every == 0 else None
                               for n in range(every * 2)])
        started = time.perf_counter()
        await method(batch, queue="bench", **kw)
        return time.perf_counter() - started


def _measure(src: Path, url: str, mode: str, jobs: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{src}:{HERE}"}
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--jobs", str(jobs),
                          "--database-url", url], env=env, capture_output=True, text=True,
                         check=True)
    return float(json.loads(out.stdout)["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-src", type=Path)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/awa_bench_copy_after"))
    ap.add_argument("--plain-only", action="store_true",
                    help="only the plain enqueue_many_copy A/B (more rounds in the same time)")
    ap.add_argument("--mixed", type=int, metavar="K",
                    help="mixed calls, every K-th job with after= (both checkouts)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        seconds = asyncio.run(_child(args.database_url, args.child, args.jobs))
        print(json.dumps({"seconds": seconds}))
        return
    assert args.baseline_src is not None, "--baseline-src is required"
    subprocess.run([sys.executable, "-m", "awa", "--database-url", args.database_url,
                    "migrate"], env={**os.environ, "PYTHONPATH": str(SRC)}, check=True,
                   capture_output=True)
    times: dict[str, list[float]] = {}
    cells = [("enqueue", args.baseline_src), ("enqueue", SRC), ("insert", args.baseline_src),
             ("insert", SRC), ("enqueue_after", SRC), ("insert_after", SRC)]
    if args.plain_only:
        cells = cells[:2]
    if args.mixed:
        cells = [(f"{call}_mixed_{args.mixed}", src) for call in ("enqueue", "insert", "many")
                 for src in (args.baseline_src, SRC)]
    for r in range(args.rounds):
        order = cells if r % 2 == 0 else cells[::-1]  # alternate which checkout goes first
        for mode, src in order:
            key = f"{mode}/{'this' if src == SRC else 'baseline'}"
            times.setdefault(key, []).append(_measure(src, args.database_url, mode, args.jobs))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    if args.mixed:
        _mixed_report(args.jobs, args.rounds, args.mixed, times)
        return
    lines = [f"# Bulk COPY with and without after= ({args.jobs:,} jobs, {args.rounds} rounds, "
             "medians)", "",
             "Generated by `bench/copy_after.py`; baseline and this checkout alternate "
             "round by round on one database.", "",
             "| call | baseline jobs/s | this jobs/s | this / baseline (throughput) |",
             "|---|---|---|---|"]
    for mode, label in (("enqueue", "enqueue_many_copy"), ("insert", "insert_many_copy")):
        if f"{mode}/this" not in med:
            continue
        base, this = med[f"{mode}/baseline"], med[f"{mode}/this"]
        paired = statistics.median(b / t for b, t in zip(
            times[f"{mode}/baseline"], times[f"{mode}/this"], strict=True))
        lines.append(f"| {label} | {args.jobs / base:,.0f} | {args.jobs / this:,.0f} | "
                     f"{base / this:.3f} (median of per-round ratios {paired:.3f}) |")
    for mode, label in (("enqueue_after", "enqueue_many_copy(after=[p])"),
                        ("insert_after", "insert_many_copy(after=[p])")):
        if f"{mode}/this" not in med:
            continue
        plain = med[f"{mode.split('_')[0]}/this"]
        lines.append(f"| {label} | | {args.jobs / med[f'{mode}/this']:,.0f} | "
                     f"{plain / med[f'{mode}/this']:.3f} of the plain call |")
    lines += ["", "Per-round seconds:", "", "```", json.dumps(times, indent=1), "```", ""]
    name = "copy_after_plain.md" if args.plain_only else "copy_after.md"
    (HERE / "results" / name).write_text("\n".join(lines))
    print("\n".join(lines))


def _mixed_report(jobs: int, rounds: int, every: int, times: dict[str, list[float]]) -> None:
    """The mixed calls' table, baseline and this checkout (printed, not written)."""
    import datetime

    print(f"## {datetime.date.today()}: mixed calls, every {every}th job with after= "
          f"({jobs:,} jobs, {rounds} rounds, medians)\n")
    print("| call | baseline jobs/s | this jobs/s | this / baseline, ratio of medians | "
          "median of per-round ratios (min-max) |")
    print("|---|---:|---:|---:|---|")
    for call, label in (("enqueue", "enqueue_many_copy"), ("insert", "insert_many_copy"),
                        ("many", "insert_many")):
        base, this = times[f"{call}_mixed_{every}/baseline"], times[f"{call}_mixed_{every}/this"]
        per = [b / t for b, t in zip(base, this, strict=True)]
        print(f"| {label} | {jobs / statistics.median(base):,.0f} | "
              f"{jobs / statistics.median(this):,.0f} | "
              f"{statistics.median(base) / statistics.median(this):.2f} | "
              f"{statistics.median(per):.2f} ({min(per):.2f}-{max(per):.2f}) |")
    print("\nPer-round seconds:\n\n```\n" + json.dumps(times, indent=1) + "\n```")


if __name__ == "__main__":
    main()
