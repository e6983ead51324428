"""Summarize a run_harness.py run: SUMMARY.md, results.json, results.csv, overview plots.

    python bench/harness/summarize.py --out bench/results/harness

Reads run_index.json and, for each cell, the harness's summary.json,
failures.json and raw.csv(.gz) in the cell's run directory.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

SYSTEMS = ["awa", "awa-pg", "procrastinate"]
COLORS = {"awa": "#1f77b4", "awa-pg": "#2ca02c", "procrastinate": "#d62728"}
CHAOS = [
    "chaos_postgres_restart",
    "chaos_pg_backend_kill",
    "chaos_pool_exhaustion",
    "chaos_crash_recovery",
    "chaos_repeated_kills",
]
PRESSURE = [
    "pressure_idle_in_tx",
    "pressure_sustained_high_load",
    "pressure_active_readers",
    "pressure_event_burst",
]


def load_raw(run_dir: Path) -> list[dict]:
    for name, opener in (("raw.csv.gz", gzip.open), ("raw.csv", open)):
        p = run_dir / name
        if p.is_file():
            with opener(p, "rt") as fh:
                return list(csv.DictReader(fh))
    return []


def series(rows: list[dict], system: str, metric: str) -> list[tuple[float, float, str]]:
    """(elapsed_s, value summed over replicas per timestamp, phase) for an adapter metric."""
    acc: dict[str, list] = {}
    for r in rows:
        if r["system"] != system or r["metric"] != metric or r.get("subject_kind") != "adapter":
            continue
        # Replicas tick a few ms apart: bucket by the 2 s sample period to sum them.
        key = round(float(r["elapsed_s"]) / 2.0)
        slot = acc.setdefault(key, [float(r["elapsed_s"]), 0.0, r["phase_label"]])
        slot[0] = min(slot[0], float(r["elapsed_s"]))
        slot[1] += float(r["value"])
    return sorted((v[0], v[1], v[2]) for v in acc.values())


def median(vals: list[float]) -> float | None:
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args()
    out: Path = ns.out.resolve()
    index = json.loads((out / "run_index.json").read_text())
    cells: dict[str, dict] = {}
    for entry in index:
        # run_harness.py records run_dir relative to the repository
        run_dir = REPO / entry["run_dir"] if entry.get("run_dir") else None
        summary = failures = {}
        rows: list[dict] = []
        if run_dir and run_dir.is_dir():
            if (run_dir / "summary.json").is_file():
                summary = json.loads((run_dir / "summary.json").read_text())
            if (run_dir / "failures.json").is_file():
                failures = json.loads((run_dir / "failures.json").read_text())
            rows = load_raw(run_dir)
        cells[entry["cell"]] = dict(
            entry=entry, summary=summary, failures=failures, rows=rows, run_dir=run_dir
        )

    results: dict = {"cells": {}, "systems": SYSTEMS}
    flat: list[dict] = []

    def phase_block(cell: str, system: str, label: str) -> dict:
        return (
            ((cells.get(cell) or {}).get("summary") or {})
            .get("systems", {})
            .get(system, {})
            .get("phases", {})
            .get(label, {})
        )

    def status(cell: str, system: str) -> str:
        c = cells.get(cell)
        if not c:
            return "not run"
        if system in (c["failures"] or {}):
            return "adapter failed"
        if c["entry"].get("rc") not in (0,):
            return f"cell rc={c['entry'].get('rc')}"
        if system not in ((c["summary"] or {}).get("systems") or {}):
            return "no samples"
        return "completed"

    for name, c in cells.items():
        block = {
            "rc": c["entry"].get("rc"),
            "elapsed_s": c["entry"].get("elapsed_s"),
            "args": c["entry"].get("args"),
            "failures": c["failures"],
            "run_dir": str(c["run_dir"].relative_to(out)) if c["run_dir"] else None,
            "systems": {},
        }
        for s in SYSTEMS:
            phases = ((c["summary"] or {}).get("systems") or {}).get(s, {}).get("phases", {})
            sb = {"status": status(name, s), "phases": {}}
            for label, pb in phases.items():
                keep = {
                    k: pb.get(k)
                    for k in (
                        "phase_type",
                        "median_throughput_per_s",
                        "median_enqueue_rate_per_s",
                        "median_queue_depth",
                        "median_claim_p99_ms",
                        "peak_dead_tup",
                        "jobs_enqueued",
                        "jobs_completed",
                        "jobs_lost",
                        "chaos_recovery_time_s",
                        "baseline_completion_rate_median",
                    )
                    if k in pb
                }
                sb["phases"][label] = keep
                flat.append({"cell": name, "system": s, "phase": label, **keep})
            block["systems"][s] = sb
        results["cells"][name] = block

    # ---------------------------------------------------------------- tables
    md: list[str] = []
    md.append("# postgresql-job-queue-benchmarking harness: awa vs awa-pg vs procrastinate\n")
    md.append(
        "Generated by `bench/harness/summarize.py` from the runs under `runs/` "
        "(see `bench/harness/NOTES.md` for method and caveats).\n"
    )

    # peak
    md.append("## Peak throughput (depth-target 4000, 32 workers, 1 replica)\n")
    md.append(
        "| system | status | completion rate, jobs/s (median of clean phase) | claim p99, ms | enqueue rate, jobs/s |"  # noqa: E501
    )
    md.append("|---|---|---:|---:|---:|")
    peak = {}
    for s in SYSTEMS:
        pb = phase_block("peak_throughput", s, "clean")
        peak[s] = pb.get("median_throughput_per_s")
        md.append(
            f"| {s} | {status('peak_throughput', s)} | {fmt(pb.get('median_throughput_per_s'))} | "
            f"{fmt(pb.get('median_claim_p99_ms'), 1)} | {fmt(pb.get('median_enqueue_rate_per_s'))} |"  # noqa: E501
        )
    results["peak_completion_rate"] = peak

    # chaos
    md.append("\n## Chaos: recovered?\n")
    md.append("| scenario | " + " | ".join(SYSTEMS) + " |")
    md.append("|---|" + "---|" * len(SYSTEMS))
    chaos_table: dict = {}
    for cell in CHAOS:
        cols = []
        for s in SYSTEMS:
            st = status(cell, s)
            pb = phase_block(cell, s, "recovery")
            rt = pb.get("chaos_recovery_time_s")
            lost = pb.get("jobs_lost")
            comp, offered = pb.get("median_throughput_per_s"), pb.get("median_enqueue_rate_per_s")
            keeps_up = bool(comp is not None and offered and comp >= 0.9 * offered)
            if st != "completed":
                txt, ok = st, False
            elif rt is not None:
                txt, ok = f"yes ({rt:.0f}s; backlog {fmt(lost)})", True
            elif keeps_up:
                # The harness rule compares with the baseline median, which a
                # catch-up burst after startup can push above the offered rate.
                txt, ok = (
                    f"yes* (keeps up: {fmt(comp)}/{fmt(offered)} jobs/s; backlog {fmt(lost)}; "
                    f"baseline median {fmt(pb.get('baseline_completion_rate_median'))})",
                    True,
                )
            else:
                txt, ok = f"no ({fmt(comp)}/{fmt(offered)} jobs/s; backlog {fmt(lost)})", False
            chaos_table.setdefault(cell, {})[s] = {
                "recovered": ok,
                "harness_rule": rt is not None,
                "keeps_up": keeps_up,
                "recovery_time_s": rt,
                "jobs_lost_estimate": lost,
                "status": st,
                "recovery_completion_per_s": comp,
                "recovery_offered_per_s": offered,
            }
            cols.append(txt)
        md.append(f"| {cell.removeprefix('chaos_')} | " + " | ".join(cols) + " |")
    md.append("\n| system | chaos scenarios recovered |")
    md.append("|---|---:|")
    for s in SYSTEMS:
        n = sum(1 for c in CHAOS if chaos_table.get(c, {}).get(s, {}).get("recovered"))
        md.append(f"| {s} | {n}/{len(CHAOS)} |")
    results["chaos"] = chaos_table
    md.append(
        "\n`yes (Ns)`: the harness's rule, completion rate back to >= 90% of the baseline median, "
        "N s after the chaos phase.  `yes*`: the harness rule missed, but in the recovery phase the "  # noqa: E501
        "system completed >= 90% of the offered rate (median completion / median enqueue), i.e. it "
        "kept up; the baseline median was above the offered rate (a catch-up burst after startup).  "  # noqa: E501
        "`no`: neither."
    )
    md.append(
        "\n`backlog` is the harness's `jobs_lost` estimate: jobs enqueued minus jobs completed over "  # noqa: E501
        "the chaos + recovery phases (rate x window integrals), i.e. work not yet done when the "
        "recovery phase ended, not necessarily lost."
    )

    # pressure
    md.append("\n## Pressure cells\n")
    md.append(
        "A cell counts as completed when the adapter ran every phase to the end (no crash, no "
        "harness timeout) and, in the recovery phase, completed at least 90% of what was "
        "offered (median completion / median enqueue rate) with a median queue depth of at most "
        "one second of offered load (the backlog from the stress phase drained).  Columns: stress-phase and "  # noqa: E501
        "recovery-phase median completion rate (jobs/s), queue depth at the recovery median.\n"
    )
    md.append(
        "| cell | system | status | stress jobs/s | recovery jobs/s | offered (recovery) | recovery depth | claim p99 stress, ms | peak dead tuples | verdict |"  # noqa: E501
    )
    md.append("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    pressure_table: dict = {}
    stress_label = {
        "pressure_idle_in_tx": "idle_1",
        "pressure_sustained_high_load": "pressure_1",
        "pressure_active_readers": "readers_1",
        "pressure_event_burst": "pressure_1",
    }
    for cell in PRESSURE:
        for s in SYSTEMS:
            st = status(cell, s)
            sp = phase_block(cell, s, stress_label[cell])
            rp = phase_block(cell, s, "recovery_1")
            comp, offered = rp.get("median_throughput_per_s"), rp.get("median_enqueue_rate_per_s")
            depth = rp.get("median_queue_depth")
            ok = bool(
                st == "completed"
                and comp is not None
                and offered
                and comp >= 0.9 * offered
                and depth is not None
                and depth <= offered
            )
            pressure_table.setdefault(cell, {})[s] = {"completed": bool(ok), "status": st}
            md.append(
                f"| {cell.removeprefix('pressure_')} | {s} | {st} | {fmt(sp.get('median_throughput_per_s'))} | "  # noqa: E501
                f"{fmt(comp)} | {fmt(offered)} | {fmt(rp.get('median_queue_depth'))} | "
                f"{fmt(sp.get('median_claim_p99_ms'), 1)} | {fmt(sp.get('peak_dead_tup'))} | "
                f"{'completed' if ok else 'not completed'} |"
            )
    md.append("\n| system | pressure cells completed |")
    md.append("|---|---:|")
    for s in SYSTEMS:
        n = sum(1 for c in PRESSURE if pressure_table.get(c, {}).get(s, {}).get("completed"))
        md.append(f"| {s} | {n}/{len(PRESSURE)} |")
    results["pressure"] = pressure_table

    # long horizon
    md.append("\n## Long horizon (shortened)\n")
    md.append(
        "| system | status | phase | median jobs/s | median queue depth | claim p99, ms | peak dead tuples |"  # noqa: E501
    )
    md.append("|---|---|---|---:|---:|---:|---:|")
    for s in SYSTEMS:
        for label in ("clean_1", "idle_1", "recovery_1", "idle_2"):
            pb = phase_block("long_horizon", s, label)
            md.append(
                f"| {s} | {status('long_horizon', s)} | {label} | {fmt(pb.get('median_throughput_per_s'))} | "  # noqa: E501
                f"{fmt(pb.get('median_queue_depth'))} | {fmt(pb.get('median_claim_p99_ms'), 1)} | "
                f"{fmt(pb.get('peak_dead_tup'))} |"
            )

    # failures
    md.append("\n## Cells\n")
    md.append("| cell | rc | wall s | adapter failures | run dir |")
    md.append("|---|---|---:|---|---|")
    for name, b in results["cells"].items():
        fails = "; ".join(f"{k}: {v[:160]}" for k, v in (b["failures"] or {}).items()) or "–"
        md.append(f"| {name} | {b['rc']} | {fmt(b['elapsed_s'])} | {fails} | `{b['run_dir']}` |")

    # ---------------------------------------------------------------- plots
    try:
        plots(cells, out, peak)
        md.append("\n## Plots\n")
        for p in sorted((out / "plots").glob("*.png")):
            md.append(f"![{p.stem}](plots/{p.name})")
    except Exception as exc:
        md.append(f"\n(plots failed: {exc!r})")

    (out / "SUMMARY.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    keys = sorted({k for r in flat for k in r})
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(
            fh,
            fieldnames=["cell", "system", "phase"]
            + [k for k in keys if k not in ("cell", "system", "phase")],
        )
        w.writeheader()
        w.writerows(flat)
    print((out / "SUMMARY.md").read_text())
    return 0


def plots(cells: dict, out: Path, peak: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pdir = out / "plots"
    pdir.mkdir(exist_ok=True)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    vals = [peak.get(s) or 0 for s in SYSTEMS]
    ax.bar(SYSTEMS, vals, color=[COLORS[s] for s in SYSTEMS])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    ax.set_ylabel("completion rate, jobs/s")
    ax.set_title("Peak throughput (depth-target 4000, W=32)")
    fig.tight_layout()
    fig.savefig(pdir / "peak_throughput.png", dpi=110)
    plt.close(fig)

    def timeline(cell_names: list[str], fname: str, metric: str, ylabel: str) -> None:
        present = [c for c in cell_names if c in cells]
        if not present:
            return
        fig, axes = plt.subplots(len(present), 1, figsize=(9, 2.6 * len(present)), squeeze=False)
        for ax, cell in zip(axes[:, 0], present, strict=False):
            rows = cells[cell]["rows"]
            bounds: dict[str, float] = {}
            for s in SYSTEMS:
                pts = series(rows, s, metric)
                if not pts:
                    continue
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s, color=COLORS[s], lw=1.3)
                if not bounds:
                    for t, _, ph in pts:
                        bounds.setdefault(ph, t)
            for ph, t in bounds.items():
                ax.axvline(t, color="#999", lw=0.6, ls=":")
                ax.text(t, ax.get_ylim()[1], ph, fontsize=7, va="top", rotation=90, color="#555")
            ax.set_title(cell, fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.legend(fontsize=7, loc="upper right")
        axes[-1, 0].set_xlabel("elapsed s (per system)")
        fig.tight_layout()
        fig.savefig(pdir / fname, dpi=100)
        plt.close(fig)

    timeline(CHAOS, "chaos_completion_rate.png", "completion_rate", "jobs/s")
    timeline(
        [*PRESSURE, "long_horizon"], "pressure_completion_rate.png", "completion_rate", "jobs/s"
    )
    timeline([*PRESSURE, "long_horizon"], "pressure_queue_depth.png", "queue_depth", "available")
    timeline([*PRESSURE, "long_horizon"], "pressure_claim_p99.png", "claim_p99_ms", "claim p99 ms")


if __name__ == "__main__":
    raise SystemExit(main())
