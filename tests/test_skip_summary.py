"""The summary line counts every skipped test of an optional suite, by marker (issue 44)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT


def test_skips_outside_a_suites_own_file_are_counted_by_marker() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AWA_CHAOS"}
    env["AWA_CHROMIUM"] = "/nonexistent/chromium"  # the browser test skips
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_ui_batch.py::test_batches_page_preview_submit_and_cancel",
         "tests/test_concurrency_keys_procs.py::test_chaos_bound_holds_across_processes"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "2 skipped" in done.stdout, done.stdout + done.stderr
    assert ("optional suites skipped: chaos (1 tests: AWA_CHAOS=1); browser (1 tests: "
            "apt-get install chromium (or set AWA_CHROMIUM))") in done.stdout
