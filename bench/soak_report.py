"""The soak's report: per-database summary, checks, slow windows, plots, Markdown.

bench/soak.py calls these once both databases have run.  Run on its own with the
bench runner's Python, it renders soak.md and the PNGs again from a soak.json:

    bench/.venvs/_runner/bin/python bench/soak_report.py [bench/results/soak.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def summarize(ph: dict) -> dict:
    ss = ph["samples"]
    warm = [s for s in ss if s["warm"]] or ss
    half = max(1, len(ss) // 2)
    # Thirds of the run by this database's blocks: with blocks alternating, the
    # two databases' thirds cover the same stretches of time.
    blocks = sorted({s["block"] for s in ss})
    n3 = max(1, len(blocks) // 3)
    thirds = [[s for s in warm if s["block"] in part]
              for part in (blocks[:n3], blocks[n3:len(blocks) - n3] or blocks, blocks[-n3:])]
    first, last = thirds[0], thirds[-1]
    jobs = sum(s["jobs"] for s in warm)
    wal = sum(s["wal_bytes"] for s in warm)

    def peak_of(key, part):
        return max((s[key] for s in part), default=None)

    ring = bool(ss) and "ring_dead" in ss[0]

    return {
        "jobs_per_s": _mean(s["jobs_per_s"] for s in warm),
        "p50_ms": ph["worker"].get("p50_ms"),
        "p99_ms": ph["worker"].get("p99_ms"),
        "max_ms": ph["worker"].get("max_ms"),
        "first_jobs_per_s": _mean(s["jobs_per_s"] for s in first),
        "last_jobs_per_s": _mean(s["jobs_per_s"] for s in last),
        "window_p99_ms": _median(s["p99_ms"] for s in warm),
        "thirds_p99_ms": [_median(s["p99_ms"] for s in part) for part in thirds],
        "wal_per_job": wal / jobs if jobs else None,
        "jobs_dead_max_first_half": peak_of("jobs_dead", ss[:half]),
        "jobs_dead_max_second_half": peak_of("jobs_dead", ss[half:]),
        "jobs_bytes_max_first_half": peak_of("jobs_bytes", ss[:half]),
        "jobs_bytes_max_second_half": peak_of("jobs_bytes", ss[half:]),
        # The append-only lane (soak.json of runs before it has no ring_* keys).
        "ring_dead_max_first_half": peak_of("ring_dead", ss[:half]) if ring else None,
        "ring_dead_max_second_half": peak_of("ring_dead", ss[half:]) if ring else None,
        "ring_bytes_max_first_half": peak_of("ring_bytes", ss[:half]) if ring else None,
        "ring_bytes_max_second_half": peak_of("ring_bytes", ss[half:]) if ring else None,
        "dlq_bytes_first": ss[0]["dlq_bytes"] if ss else None,
        "dlq_bytes_last": ss[-1]["dlq_bytes"] if ss else None,
        "done_bytes_first": ss[0]["done_bytes"] if ss else None,
        "done_bytes_last": ss[-1]["done_bytes"] if ss else None,
        "expired_partitions_last": ss[-1]["expired_partitions"] if ss else None,
        "default_rows_max": peak_of("default_rows", ss),
        "backlog_max": peak_of("backlog", ss),
        "host_busy_pct_mean": _mean(s.get("host_busy_pct", 0.0) for s in warm),
        "host_steal_pct_max": peak_of("host_steal_pct", ss),
        "host_steal_pct_mean": _mean(s.get("host_steal_pct", 0.0) for s in warm),
        "jobs_vacuums": (ss[-1]["jobs_vacuums"] - ss[0]["jobs_vacuums"]) if ss else None,
        "partitions_dropped": len(ph["dropped_partitions"]),
        "producer_max_behind_s": ph["producer"].get("max_behind_s"),
        "oldest_xact_s_max": peak_of("oldest_xact_s", ss),
        "horizon_lag_xids_max": peak_of("horizon_lag_xids", ss),
        "oldest_xact_db": max(ss, key=lambda s: s["oldest_xact_s"])["oldest_xact_db"]
        if ss else None,
        "checkpoints": sum(s.get("checkpoints", 0) for s in warm),
        "loop_lag_ms_max": peak_of("loop_lag_ms", warm) if warm and "loop_lag_ms" in warm[0]
        else None,
        "slow_windows": slow_windows(ph),
    }


SLOW_WINDOW_MS = 200.0  # a window whose p99 is above this and 4x the median window's
STEAL_PCT = 5.0  # hypervisor steal that counts as "the machine was taken away"
QUIET_STEAL_PCT = 1.0  # mean steal above this: the run says more about the neighbours
LOOP_STALL_MS = 100.0  # the worker's event loop did not run for this long
COMMIT_STALL_MS = 200.0  # the probe's one-row commit took this long
SEEN_MS = 100.0  # a statement seen running this long is named in the window's line
#: What a slow window is checked against, in the report's order.
CAUSES = ("steal", "checkpoint", "worker stalled", "commits stalled", "partition drop",
          "slow statement")
STATEMENT_STALL_MS = 500.0  # a statement the activity probe saw running this long


def slow_windows(ph: dict) -> list[dict]:
    """Warm windows with a p99 far above the typical one, each with what coincided
    with it in that window or the one before (a stall shows up as the backlog it
    leaves): hypervisor steal, a checkpoint finishing, the worker's loop stalling,
    the probe's commit stalling, a partition drop."""
    ss = ph["samples"]
    typical = _median(s["p99_ms"] for s in ss if s["warm"]) or 0.0
    bar = max(SLOW_WINDOW_MS, 4 * typical)
    drops = [d["t"] for d in ph["dropped_partitions"]]
    out = []
    for i, s in enumerate(ss):
        if not s["warm"] or (s["p99_ms"] or 0) <= bar:
            continue
        both = [x for x in ss[max(0, i - 1):i + 1] if x["block"] == s["block"]]
        out.append({
            "t": s["t"], "p99_ms": s["p99_ms"], "backlog": s["backlog"],
            "steal_pct": max(x.get("host_steal_pct", 0.0) for x in both),
            "checkpoint": any(x.get("checkpoints") for x in both),
            "loop_lag_ms": max((x.get("loop_lag_ms") or 0.0) for x in both),
            "commit_max_ms": max((x.get("commit_max_ms") or 0.0) for x in both),
            "claim_max_ms": max((x.get("claim_max_ms") or 0.0) for x in both),
            "gc_ms": max((x.get("gc_ms") or 0.0) for x in both),
            "flush_max_ms": max((x.get("flush_max_ms") or 0.0) for x in both),
            "statement_max_ms": max((x.get("statement_max_ms") or 0.0) for x in both),
            "statement": max(both, key=lambda x: x.get("statement_max_ms") or 0.0)
            .get("statement_max"),
            "partition_drop": any(both[0]["t"] - ph["sample_s"] <= t <= s["t"]
                                  for t in drops),
        })
    for w in out:
        hits = (w["steal_pct"] >= STEAL_PCT, w["checkpoint"],
                w["loop_lag_ms"] >= LOOP_STALL_MS, w["commit_max_ms"] >= COMMIT_STALL_MS,
                w["partition_drop"], w["statement_max_ms"] >= STATEMENT_STALL_MS)
        w["causes"] = [name for name, hit in zip(CAUSES, hits, strict=True) if hit]
    return out


def _within(a, b, tol):
    return a is not None and b is not None and b > 0 and abs(a / b - 1) <= tol


def _bounded(first, second, floor):
    return first is not None and second is not None and second <= max(1.25 * first, floor)


def checks(fresh: dict, soak: dict) -> list[dict]:
    f, s = fresh["summary"], soak["summary"]
    out = []

    def add(name, value, target, ok):
        out.append({"check": name, "value": value, "target": target, "ok": bool(ok)})

    # A precondition, not a result: with the hypervisor taking a tenth of the
    # CPU (other tenants), backlogs come and go with the neighbours and the two
    # runs compare the machine's two half-hours, not a fresh and a full table.
    fs_, ss_ = f.get("host_steal_pct_mean"), s.get("host_steal_pct_mean")
    add("machine quiet enough to compare: mean CPU steal of warm windows, fresh / soak, %",
        f"{fs_:.2f} / {ss_:.2f}" if fs_ is not None and ss_ is not None else None,
        f"≤ {QUIET_STEAL_PCT:g} each", fs_ is not None and ss_ is not None
        and max(fs_, ss_) <= QUIET_STEAL_PCT)
    r = s["jobs_per_s"] / f["jobs_per_s"] if f["jobs_per_s"] and s["jobs_per_s"] else None
    add("throughput, soak ÷ fresh", r, "0.90–1.10", r is not None and abs(r - 1) <= 0.10)
    r = s["p99_ms"] / f["p99_ms"] if f["p99_ms"] and s["p99_ms"] else None
    add("pickup p99, soak ÷ fresh", r, "≤ 1.10", r is not None and r <= 1.10)
    # The same, robust to a few slow windows (this machine is shared): the
    # typical 5-second window's p99 of each run.
    r = (s["window_p99_ms"] / f["window_p99_ms"]
         if f.get("window_p99_ms") and s.get("window_p99_ms") else None)
    add("pickup p99 (median of windows), soak ÷ fresh", r, "≤ 1.10",
        r is not None and r <= 1.10)
    add("soak throughput, last third ÷ first third",
        s["last_jobs_per_s"] / s["first_jobs_per_s"] if s["first_jobs_per_s"] else None,
        "0.90–1.10", _within(s["last_jobs_per_s"], s["first_jobs_per_s"], 0.10))
    # Staying within 10% as the run goes on: each third of the soak against the
    # fresh database's blocks of the same stretch of time.
    rs = [a / b if a and b else None
          for a, b in zip(s["thirds_p99_ms"], f["thirds_p99_ms"], strict=True)]
    add("pickup p99 (median of windows), soak ÷ fresh, in each third of the run",
        " / ".join(f"{r:.2f}" if r is not None else "–" for r in rs), "≤ 1.10 each",
        all(r is not None and r <= 1.10 for r in rs))
    add("awa.jobs dead tuples: max of 2nd half vs 1st half",
        f"{s['jobs_dead_max_second_half']:,} vs {s['jobs_dead_max_first_half']:,}",
        "≤ max(1.25 × 1st half, 20,000)",
        _bounded(s["jobs_dead_max_first_half"], s["jobs_dead_max_second_half"], 20_000))
    add("awa.jobs size: max of 2nd half vs 1st half (bytes)",
        f"{s['jobs_bytes_max_second_half']:,} vs {s['jobs_bytes_max_first_half']:,}",
        "≤ max(1.25 × 1st half, 8 MiB)",
        _bounded(s["jobs_bytes_max_first_half"], s["jobs_bytes_max_second_half"], 8 << 20))
    if s.get("ring_dead_max_first_half") is not None:
        add("append-only lane's tables, dead tuples: max of 2nd half vs 1st half",
            f"{s['ring_dead_max_second_half']:,} vs {s['ring_dead_max_first_half']:,}",
            "≤ max(1.25 × 1st half, 20,000)",
            _bounded(s["ring_dead_max_first_half"], s["ring_dead_max_second_half"], 20_000))
        add("append-only lane's tables, size: max of 2nd half vs 1st half (bytes)",
            f"{s['ring_bytes_max_second_half']:,} vs {s['ring_bytes_max_first_half']:,}",
            "≤ max(1.25 × 1st half, 64 MiB)",
            _bounded(s["ring_bytes_max_first_half"], s["ring_bytes_max_second_half"],
                     64 << 20))
    add("awa.dlq size: last vs first (bytes)", f"{s['dlq_bytes_last']:,} vs "
        f"{s['dlq_bytes_first']:,}", "unchanged (no failures)",
        s["dlq_bytes_last"] == s["dlq_bytes_first"])
    add("expired jobs_done partitions left at the end", s["expired_partitions_last"], "0",
        s["expired_partitions_last"] == 0)
    add("rows in jobs_done_default (max, both phases)",
        f"fresh {f['default_rows_max']:,}, soak {s['default_rows_max']:,}", "0",
        f["default_rows_max"] == 0 and s["default_rows_max"] == 0)
    add("every produced job completed exactly once (both phases)",
        f"fresh {fresh['verify']['completed']:,}, soak {soak['verify']['completed']:,}",
        "== produced", fresh["verify"]["ok"] and soak["verify"]["ok"])
    return out


def _block_series(samples: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(minutes, values) of one series, broken (NaN) between blocks."""
    t: list[float] = []
    ys: list[float] = []
    for i, smp in enumerate(samples):
        if i and smp["block"] != samples[i - 1]["block"]:
            t.append(smp["t"] / 60)
            ys.append(float("nan"))
        t.append(smp["t"] / 60)
        ys.append(smp[key] if smp[key] is not None else float("nan"))
    return t, ys


def plots(fresh: dict, soak: dict, rate: float, results: Path) -> list[str]:
    """The four PNGs of the soak in ``results``; their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    phases = [(fresh, "fresh database", "tab:blue"),
              (soak, f"{soak['history']:,} jobs of history", "tab:red")]

    def fig(name, panels, hline=None):
        """panels: [(title, ylabel, [(key, style, suffix), ...]), ...], stacked."""
        f, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), dpi=100,
                               squeeze=False, sharex=True)
        for ax, (title, ylabel, series) in zip(axes[:, 0], panels, strict=True):
            for ph, label, color in phases:
                for key, style, suffix in series:
                    t, ys = _block_series(ph["samples"], key)
                    ax.plot(t, ys, style, color=color, label=f"{label}{suffix}", linewidth=1.4)
            for d in soak["dropped_partitions"]:
                ax.axvline(d["t"] / 60, color="tab:gray", linestyle=":", linewidth=1)
            if hline:
                ax.axhline(hline[0], color="black", linestyle="--", linewidth=0.8,
                           label=hline[1])
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[-1, 0].set_xlabel("minutes since the first block started"
                               + ("; dotted: a jobs_done partition dropped"
                                  if soak["dropped_partitions"] else ""))
        f.tight_layout()
        path = results / f"soak_{name}.png"
        f.savefig(path)
        plt.close(f)
        out.append(path.name)

    for ph, _, _ in phases:
        for s in ph["samples"]:
            s["jobs_mib"] = s["jobs_bytes"] / 2**20
            s["ring_mib"] = s.get("ring_bytes", 0) / 2**20
            s.setdefault("ring_dead", 0)
            s["done_gib"] = s["done_bytes"] / 2**30
            s["dlq_mib"] = s["dlq_bytes"] / 2**20
    fig("throughput", [("Completed jobs/s, one worker process", "jobs/s",
                        [("jobs_per_s", "-", "")])], (rate, f"offered {rate:,.0f}/s"))
    fig("p99", [("Pickup latency, insert → handler start (per window)", "ms",
                 [("p99_ms", "-", " p99"), ("p50_ms", ":", " p50")])])
    fig("dead_tuples", [("Dead tuples in awa.jobs and in the append-only lane's tables "
                          "(n_dead_tup)", "dead tuples",
                         [("jobs_dead", "-", " awa.jobs"), ("ring_dead", ":", " lane")]),
                        ("xmin horizon lag: XIDs between the oldest running transaction "
                         "(any database) and the next", "XIDs", [("horizon_lag_xids", "-", "")])])
    fig("table_size", [
        ("awa.jobs and the append-only lane's tables (total relation size)", "MiB",
         [("jobs_mib", "-", " awa.jobs"), ("ring_mib", ":", " lane")]),
        ("awa.jobs_done, all partitions", "GiB", [("done_gib", "-", "")]),
        ("awa.dlq", "MiB", [("dlq_mib", "-", "")])])
    return out


def peak_line(report: dict) -> str:
    """How the peak was found (drain, loaded, or given) and the load offered."""
    pk, c = report["peak"], report["concurrency"]
    drain = pk.get("drain", pk)

    def drains() -> str:
        return (f"one worker process x{c}, {drain['n']:,} no-op jobs, median of "
                f"{len(drain['rounds'])} drains: "
                + ", ".join(f"{x:,.0f}" for x in drain["rounds"]) + " jobs/s")

    if not pk.get("measured"):
        head = "Peak (given with --peak): "
    elif pk.get("kind") == "loaded":
        head = (f"Peak drain ({drains()}): {drain['jobs_per_s']:,.0f} jobs/s. Peak loaded "
                f"(the soak's producer offering {pk['offered']:,.0f} jobs/s, "
                f"{pk['offered'] / drain['jobs_per_s']:.2f}x that, to one worker process on "
                f"a fresh database for {pk['seconds']:g} s; jobs completed over the last "
                f"{pk['counted_s']:.0f} s; {pk['backlog_at_end']:,} jobs left waiting at the "
                "end), the peak that counts: ")
    else:
        head = f"Peak drain ({drains()}): "
    return (head + f"**{pk['jobs_per_s']:,.0f} jobs/s**; offered load "
            f"{report['rate']:,.0f} jobs/s ({report['rate'] / pk['jobs_per_s']:.0%} of peak).")


def markdown(report: dict, fmt) -> str:
    """soak.md: parameters, the two databases side by side, checks, plots, slow windows."""
    fr, so = report["fresh"], report["soak"]
    fs, ss = fr["summary"], so["summary"]
    L = [f"# Awa soak — {report['started']}", "", report["env_line"], "",
         peak_line(report), "",
         f"History: {so['history']:,} finished jobs in awa.jobs_done"
         + (f" (seeded in {so['seeded']['insert_seconds']:.0f}s, vacuumed in "
            f"{so['seeded']['vacuum_seconds']:.0f}s)" if so.get("seeded") else "")
         + f". Each database was offered the load for {so['minutes']:g} min in "
         f"{so['blocks']} blocks of {so['minutes'] / so['blocks']:g} min, the two alternating "
         "(soak, fresh, fresh, soak, soak, fresh, ...) with both workers running throughout, "
         f"sampled every {report['sample_seconds']:g}s; the first {so['warmup_s']:.0f}s of "
         "each database's first block are warm-up.", "",
         "| | fresh | soak |", "|---|---:|---:|"]
    rows = [("completed jobs/s (mean of windows)", "jobs_per_s"),
            ("pickup p50, ms", "p50_ms"), ("pickup p99, ms", "p99_ms"),
            ("pickup p99 of the median 5-s window, ms", "window_p99_ms"),
            ("pickup max, ms", "max_ms"), ("WAL bytes / job", "wal_per_job"),
            ("awa.jobs dead tuples, max", "jobs_dead_max_second_half"),
            ("awa.jobs size, max bytes (2nd half)", "jobs_bytes_max_second_half"),
            ("append-only lane's tables, dead tuples, max (2nd half)",
             "ring_dead_max_second_half"),
            ("append-only lane's tables, size, max bytes (2nd half)",
             "ring_bytes_max_second_half"),
            ("awa.jobs vacuums by the leader", "jobs_vacuums"),
            ("jobs_done size at the end, bytes", "done_bytes_last"),
            ("jobs_done partitions dropped", "partitions_dropped"),
            ("largest backlog in awa.jobs", "backlog_max"),
            ("machine CPU busy, % of both cores (mean of windows)", "host_busy_pct_mean"),
            ("CPU stolen by the hypervisor, % (worst window)", "host_steal_pct_max"),
            ("CPU stolen by the hypervisor, % (mean of windows)", "host_steal_pct_mean"),
            ("producer, most seconds behind schedule", "producer_max_behind_s"),
            ("checkpoints finished", "checkpoints"),
            ("worker event loop, longest stall, ms", "loop_lag_ms_max")]
    for label, key in rows:
        L.append(f"| {label} | {fmt(fs.get(key))} | {fmt(ss.get(key))} |")
    L += ["", "| check | value | target | |", "|---|---:|---|---|"]
    for c in report["checks"]:
        v = c["value"]
        v = fmt(v) if isinstance(v, int | float) else (v if v is not None else "–")
        L.append(f"| {c['check']} | {v} | {c['target']} | {'✓' if c['ok'] else '✗'} |")
    L += [""] + [f"![{p}]({p})" for p in report["plots"]] + [""]
    L += slow_window_lines(fr, so, fmt)
    L.append(f"The worker runs with Awa's defaults (cleanup every 60 s, so the first pruning "
             f"pass comes up to a minute after start; completed retention 24 h). "
             f"Oldest transaction holding an XID on the server during the soak: "
             f"{ss['oldest_xact_s_max']:.0f}s (database {ss['oldest_xact_db']})"
             + (". **A transaction that old holds back the xmin horizon: dead rows in "
                "awa.jobs can be neither vacuumed nor skipped cheaply by the claim index "
                "scan, so these figures measure that interference, not Awa.**"
                if (ss["oldest_xact_s_max"] or 0) > 30 else ".")
             + f" (fresh run: {fs['oldest_xact_s_max']:.0f}s). Largest xmin horizon lag "
             f"sampled: {fmt(ss['horizon_lag_xids_max'])} XIDs (fresh: "
             f"{fmt(fs['horizon_lag_xids_max'])}); the dead-tuples plot shows it over time.")
    L.append("")
    long = [(ph_name, smp["t"], smp["long_statement"])
            for ph_name, ph in (("fresh", fr), ("soak", so)) for smp in ph["samples"]
            if smp.get("long_statement")]
    if long:
        L.append("Statements running for over 5 s at a sample (the longest one; at most 30 "
                 "listed):")
        L += [f"- {name} t={t:.0f}s: {text}" for name, t, text in long[:30]]
        L.append("")
    if so["dropped_partitions"]:
        L.append("Partitions dropped during the soak: " + ", ".join(
            f"`{d['partition']}` at {d['t'] / 60:.1f} min" for d in so["dropped_partitions"]))
        L.append("")
    return "\n".join(L)


def sample_line(s: dict, fmt) -> str:
    """The console line of one window: throughput, pickup, sizes, machine, probes."""
    return (f"  t={s['t']:6.0f}s {s['jobs_per_s']:8,.0f} jobs/s  p50 {fmt(s['p50_ms'])} p99 "
          f"{fmt(s['p99_ms'])} ms  dead {s['jobs_dead']:,}  jobs {s['jobs_bytes'] / 2**20:.1f} "
          f"MiB  lane dead {s.get('ring_dead', 0):,} {s.get('ring_bytes', 0) / 2**20:.1f} MiB"
          f"  done {s['done_bytes'] / 2**20:,.0f} MiB ({s['partitions']} parts, "
          f"{s['expired_partitions']} expired)  cpu {s['host_busy_pct']:.0f}% steal "
          f"{s['host_steal_pct']:.1f}%  lag {fmt(s['loop_lag_ms'])} ms  commit "
          f"{fmt(s['commit_max_ms'])} ms  claims {s['claims']} (slowest "
          f"{fmt(s['claim_max_ms'])} ms)  batches {s['flushes']} (slowest "
          f"{fmt(s['flush_max_ms'])} ms)"
          + (" ckpt" if s["checkpoints"] else "")
          + (f"  [xact open {s['oldest_xact_s']:.0f}s in {s['oldest_xact_db']}]"
             if s["oldest_xact_s"] > 10 else "")
          + (f"  [seen {s['statement_max_ms']:.0f} ms: {s['statement_max']}]"
             if (s["statement_max_ms"] or 0) >= SEEN_MS
             else "")
          + (f"  [running {s['long_statement']}]" if s["long_statement"] else ""))


def slow_window_lines(fr: dict, so: dict, fmt) -> list[str]:
    """What coincided with each slow window of both runs, and the tally."""
    L = [f"Slow windows (warm, p99 above {SLOW_WINDOW_MS:.0f} ms and 4x the median "
         f"window's), with what happened in that window or the one before: steal ≥ "
         f"{STEAL_PCT:g}%, a checkpoint finishing, the worker's event loop stalled ≥ "
         f"{LOOP_STALL_MS:.0f} ms, a probe's one-row commit (every 100 ms, its own "
         f"connection) taking ≥ {COMMIT_STALL_MS:.0f} ms, a partition drop, a statement "
         f"seen running ≥ {STATEMENT_STALL_MS:.0f} ms by the activity probe (every 100 ms; "
         "the longest one is quoted under the table).", ""]
    for ph in (fr, so):
        ws = ph["summary"]["slow_windows"]
        n_warm = sum(1 for s in ph["samples"] if s["warm"])
        tally = {c: sum(c in w["causes"] for w in ws) for c in CAUSES}
        L.append(f"- {ph['name']}: {len(ws)} of {n_warm} windows; "
                 + ", ".join(f"{c} {k}" for c, k in tally.items())
                 + f", none of these {sum(1 for w in ws if not w['causes'])}.")
    L += ["", "| run | t, s | p99, ms | backlog | steal % | loop stall, ms | GC, ms | "
          "slowest probe commit, ms | slowest claim, ms | slowest completion batch, ms | "
          "longest statement seen, ms | coincided with |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for ph in (fr, so):
        for w in ph["summary"]["slow_windows"]:
            L.append(f"| {ph['name']} | {w['t']:.0f} | {fmt(w['p99_ms'])} | "
                     f"{fmt(w['backlog'])} | {w['steal_pct']:.1f} | {fmt(w['loop_lag_ms'])} | "
                     f"{fmt(w['gc_ms'])} | {fmt(w['commit_max_ms'])} | "
                     f"{fmt(w['claim_max_ms'])} | {fmt(w['flush_max_ms'])} | "
                     f"{fmt(w['statement_max_ms'])} | "
                     f"{', '.join(w['causes']) or '–'} |")
    seen = [(ph["name"], w["t"], w["statement_max_ms"], w["statement"]) for ph in (fr, so)
            for w in ph["summary"]["slow_windows"]
            if w["statement"] and w["statement_max_ms"] >= SEEN_MS]
    if seen:
        L += ["", "The longest statement seen in those windows (or the one before), where it "
              f"ran ≥ {SEEN_MS:.0f} ms:", ""]
        L += [f"- {name} t={t:.0f}s: {ms:.0f} ms, {text}" for name, t, ms, text in seen]
    return [*L, ""]


def render(report: dict, results: Path, fmt) -> str:
    """Draw the plots into ``results`` (named in report["plots"]); soak.md's text."""
    report["plots"] = plots(report["fresh"], report["soak"], report["rate"], results)
    return markdown(report, fmt)


def main(argv: list[str]) -> None:
    """Render soak.md and the plots again from a soak.json (its directory)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchtools

    path = Path(argv[0] if argv else benchtools.RESULTS / "soak.json")
    report = json.loads(path.read_text())
    report.setdefault("concurrency", 32)  # every soak ran 32; reports before 12-02 lack it
    (path.parent / "soak.md").write_text(render(report, path.parent, benchtools.fmt))
    print(f"wrote {path.parent / 'soak.md'} and {', '.join(report['plots'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
