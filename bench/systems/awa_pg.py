"""Benchmark driver for awa-pg (the Rust-backed Awa SDK on PyPI).

Same public API as this repo's awa, so it runs the awa driver unchanged,
flagged with FLAVOR = "awa-pg" (used only for the version string and for
activating awa-pg's queue-storage engine at setup).
"""

import os
import runpy

runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "awa.py"),
    init_globals={"FLAVOR": "awa-pg"},
    run_name="__main__",
)
