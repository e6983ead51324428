"""Committed benchmark results and scripts name no machine's directories.

Logs, manifests and notes under bench/results, and the scripts in bench/, are
read and run on other machines: paths in them are repository-relative, or a
placeholder such as ``<harness-clone>`` (bench/harness/run_harness.py writes
them that way).
"""

from __future__ import annotations

import gzip
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
#: An absolute path into a machine's work, temporary or home directories.
MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/(?:work|tmp|root|home)/")


def _committed(folder: str = "bench/results") -> list[Path]:
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", folder],
                                capture_output=True, check=True).stdout.decode()
        return [REPO / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        return [p for p in (REPO / folder).rglob("*") if p.is_file()
                and ".venvs" not in p.parts]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if b"\0" in data[:8192]:
        return None  # binary (plots)
    return data.decode(errors="replace")


def test_committed_results_name_no_machine_path() -> None:
    found = []
    for path in _committed():
        text = _text(path) if path.is_file() else None
        for n, line in enumerate((text or "").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert found == []


def test_bench_scripts_name_no_machine_path() -> None:
    """Their usage text and defaults are relative to the repository (``../main``) or
    the running interpreter (``sys.executable``): the scripts run on other machines."""
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}"
             for path in _committed("bench") if path.suffix == ".py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if MACHINE_PATH.search(line)]
    assert found == []


def test_the_check_can_fail() -> None:
    assert MACHINE_PATH.search('"run_dir": "/work/main/bench/results"')
    assert MACHINE_PATH.search("File /root/.pyenv/versions/3.11.7/lib/x.py")
    assert not MACHINE_PATH.search("bench/results/harness/runs/x <harness-clone>/tmp/x")
    assert not MACHINE_PATH.search("https://github.com/org/work/tree ~/.pyenv/versions")


def _run_harness():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "run_harness", REPO / "bench" / "harness" / "run_harness.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_harness_runner_writes_portable_paths(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    rh = _run_harness()
    monkeypatch.setattr(rh, "REPO", Path("/work/checkout"))
    monkeypatch.setattr(Path, "home", lambda: Path("/root"))
    harness = Path("/work/checkout/bench/.harness/pqjb")
    text = ("$ /work/checkout/bench/.venvs/harness-runner/bin/python --harness "
            "/work/checkout/bench/.harness/pqjb --results /work/checkout/bench/results/runs\n"
            'File "/root/.pyenv/versions/3.12.1/lib/x.py" cwd=/work/checkout\r\n')
    assert rh.scrub_paths(text, harness) == (
        "$ bench/.venvs/harness-runner/bin/python --harness <harness-clone> "
        "--results bench/results/runs\n"
        'File "~/.pyenv/versions/3.12.1/lib/x.py" cwd=.\r\n')
    log = tmp_path / "cell.log"
    log.write_bytes(text.encode())
    rh.scrub_files([log], harness)
    assert log.read_bytes() == rh.scrub_paths(text, harness).encode()  # \r\n kept


def test_a_missing_harness_clone_is_a_clear_error(tmp_path: Path) -> None:
    rh = _run_harness()
    with pytest.raises(SystemExit, match="does not exist"):
        rh.ensure_harness(tmp_path / "nowhere", rh.GITHUB)
    with pytest.raises(SystemExit, match="not a clone"):
        rh.ensure_harness(tmp_path, rh.GITHUB)
