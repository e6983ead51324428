"""A script running a worker in its own process, stopped with Ctrl-C (issue 44, item 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import SUBPROCESS_PATH

SCRIPT = '''
import asyncio
import awa

client = awa.AsyncClient()


@client.task(kind="k", queue="q")
async def handle(job):
    return None


async def main():
    async with client:
        await client.start()
        print("started", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    awa.run(main())
'''


def test_ctrl_c_stops_an_awa_run_script_with_one_line(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "worker_script.py").write_text(SCRIPT)
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "worker_script.py")], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err == "interrupted (Ctrl-C): stopped\n"  # no CancelledError traceback
