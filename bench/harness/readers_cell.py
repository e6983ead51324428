"""The harness's active-readers phase at full length (--readers-s, 600 by default) at a fixed
rate, as ../shared/tools/xmin_cell.py does for idle-in-tx. The readers scan ACTIVE_READER_SQL
(the harness's variable; default: a count of the manifest's first table, awa.jobs). Usage, from
the repository root:

    ACTIVE_READER_SQL='SELECT count(*) FROM awa.ready' python bench/harness/readers_cell.py \\
        --readers-s 600 --rate 800 --systems awa --out DIR
"""

from __future__ import annotations

import argparse
import runpy
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--readers-s", type=int, default=600)
ap.add_argument("--rate", type=int, default=800)
ap.add_argument("--systems", default="awa")
ap.add_argument("--out", required=True)
ns = ap.parse_args()
mod = runpy.run_path("bench/harness/run_harness.py", run_name="readers_cell")
orig = mod["cells"]


def cells(scale: float) -> list[dict]:
    """The harness runner's cells plus readers_long."""
    return [*orig(scale), dict(name="readers_long", group="readers", args=[
        "--phase", "warmup=warmup:20s", "--phase", "clean_1=clean:60s",
        "--phase", f"readers_1=active-readers:{ns.readers_s}s",
        "--phase", "recovery_1=recovery:120s",
        "--producer-rate", "{pressure_rate}", "--worker-count", "32"])]


mod["main"].__globals__["cells"] = cells
sys.argv = ["run_harness.py", "--cells", "readers_long", "--systems", ns.systems,
            "--pressure-rate", str(ns.rate), "--out", ns.out]
try:
    mod["main"]()
except SystemExit:
    pass
