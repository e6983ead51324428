"""awa-pg adapter for the postgresql-job-queue-benchmarking harness.

awa-pg (the Rust-backed Awa SDK on PyPI) has the same import name and the same
public client API as our awa, so this runs awa_adapter.py unchanged with
FLAVOR = "awa-pg".  The flavor only changes the version string, the system
name, the tables reported to the harness, and, at setup, activating awa-pg's
queue-storage engine (install_queue_storage(), public API), which
enqueue_many_copy requires.  Run it from a venv that has awa-pg installed.
"""

import os
import runpy

runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "awa_adapter.py"),
    init_globals={"FLAVOR": "awa-pg"},
    run_name="__main__",
)
