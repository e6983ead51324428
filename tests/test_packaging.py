"""The package as PyPI will serve it: build the sdist and the wheel (the wheel from the
sdist, so the sdist is complete), check their metadata, install the wheel into a fresh
virtual environment and run the README's quick start from it (issue 44, item 11).

Publishing is then one step: ``python -m build && twine upload dist/*``.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from tests.helpers import ROOT

import awa

pytestmark = pytest.mark.packaging


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel of this checkout (its files as git sees them, edits included)."""
    base = tmp_path_factory.mktemp("packaging")
    tree = base / "tree"
    listed = _run("git", "ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT).split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    out = base / "dist"
    # --no-isolation: the backend (setuptools, in the dev extra) is already here, no download
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, tree, cwd=base)
    return out


def test_the_sdist_and_wheel_carry_the_right_metadata_and_files(dist: Path) -> None:
    version = awa.__version__
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    assert sdist.name == f"awa_queue-{version}.tar.gz"
    assert wheel.name == f"awa_queue-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = f"awa_queue-{version}.dist-info"
        meta = email.message_from_string(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert meta["Name"] == "awa-queue" and meta["Version"] == version
    assert meta["Requires-Python"] == ">=3.11"
    assert {"embedded", "ui", "cel", "telemetry", "django"} <= set(meta.get_all("Provides-Extra"))
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("asyncpg") for r in requires)
    assert "Programming Language :: Python :: 3.13" in meta.get_all("Classifier")
    assert "Awa — a Postgres-native job queue" in meta.get_payload()  # the README
    assert "awa = awa.cli:main" in entry_points and "awa = awa.testing" in entry_points
    package = {n for n in names if n.startswith("awa/")}
    for needed in ("awa/py.typed", "awa/db/sql/job.sql", "awa/db/sql/migrations/0001_jobs.sql",
                   "awa/web/ui/static/index.html", "awa/web/ui/static/app.js"):
        assert needed in package
    assert not any(n.startswith("tests/") for n in names)
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/awa/db/sql/job.sql"} <= members


def test_the_quick_start_runs_from_the_installed_wheel(dist: Path, database_url: str,
                                                       tmp_path: Path) -> None:
    [wheel] = dist.glob("*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
         cwd=tmp_path, timeout=600)
    shutil.copy(ROOT / "examples" / "quickstart.py", tmp_path / "quickstart.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["DATABASE_URL"] = database_url
    where = _run(python, "-c", "import awa; print(awa.__file__)", cwd=tmp_path, env=env)
    assert where.startswith(str(venv))  # the installed wheel, not this checkout
    assert _run(python, "quickstart.py", cwd=tmp_path, env=env, timeout=120) \
        == "order 1 shipped on attempt 1\n"
    assert _run(venv / "bin" / "awa", "--version", cwd=tmp_path, env=env) \
        == f"awa {awa.__version__}\n"
