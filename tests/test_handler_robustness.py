"""A handler cannot kill or wedge its worker (issue 40, item 5).

Unstorable or huge error text, ``sys.exit()`` / ``KeyboardInterrupt`` in a
handler, and SIGTERM / SIGINT while a plain ``def`` handler runs, through a
real ``awa worker`` process where a process is what is at stake.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import FAST, ROOT, SUBPROCESS_PATH, TO_MUTABLE, wait_for_state, wait_until
from tests.ui_helpers import call, serving

import awa
from awa.core import states
from awa.testing import AwaTestClient
from awa.web.ui import ui_app


def sleep_args(seconds: float) -> dict[str, Any]:
    """Args of ``sync_sleep`` (the app module needs DATABASE_URL to import: not here)."""
    return {"seconds": seconds}


#: Far longer than any test waits: a handler still sleeping this long was abandoned.
FOREVER = 600.0
#: Generous bound on a worker's exit once nothing should keep it (start-up and
#: shutdown of a process on a loaded machine fit many times over).
EXIT_BOUND = 60.0


# -- error text -------------------------------------------------------------------------

async def test_error_with_nul_and_lone_surrogate_is_recorded(client: awa.AsyncClient) -> None:
    """Before: the outcome could not be written; the job sat running until rescue
    replaced its error with "heartbeat stale"."""
    harness = AwaTestClient(client)

    name = os.fsdecode(b"caf\xe9.txt")  # a non-UTF-8 file name: a lone surrogate

    async def raises(job: awa.JobContext) -> None:
        raise OSError(f"cannot open {name}: bad\x00byte")

    job = await client.insert({"n": 1}, kind="raises", max_attempts=1)
    result = await harness.work_one(dict, raises, kind="raises")
    assert result.is_failed()
    stored = await client.get_job(job.id)
    assert stored.state is awa.JobState.Failed
    error = stored.errors[-1]["error"]
    assert error.startswith("OSError: cannot open caf\\udce9.txt: bad\\x00byte")
    assert "raises" in error  # the traceback is kept

    async def cancels(job: awa.JobContext) -> awa.Cancel:
        return awa.Cancel("nul\x00 and \udc80")

    job = await client.insert({"n": 2}, kind="cancels")
    assert (await harness.work_one(dict, cancels, kind="cancels")).is_cancelled()
    stored = await client.get_job(job.id)
    assert stored.state is awa.JobState.Cancelled
    assert stored.errors[-1]["error"] == "cancelled: nul\\x00 and \\udc80"


async def test_a_huge_error_is_cut_with_a_marker(client: awa.AsyncClient) -> None:
    harness = AwaTestClient(client)

    def shouts(job: awa.JobContext) -> None:  # a plain def, for the thread path too
        raise ValueError("x" * (5 * states.ERROR_TEXT_MAX))

    job = await client.insert({"n": 1}, kind="shouts", max_attempts=2)
    assert (await harness.work_one(dict, shouts, kind="shouts")).is_retryable()
    error = (await client.get_job(job.id)).errors[-1]["error"]
    assert len(error) <= states.ERROR_TEXT_MAX
    assert f"[cut: {5 * states.ERROR_TEXT_MAX + len('ValueError: ')} characters in all]" \
        in error
    assert error.startswith("ValueError: xxx") and 'in shouts' in error  # traceback kept


async def test_the_job_page_cuts_each_error(client: awa.AsyncClient) -> None:
    """Errors stored before the cap (or written by hand) are cut on the job page."""
    job = await client.insert({"n": 1}, kind="k")
    pool = await client.pool()
    huge = "y" * (4 * states.ERROR_TEXT_MAX)
    await pool.execute(TO_MUTABLE, job.id)  # a ring job moves to awa.jobs first
    assert await pool.execute(
        "UPDATE awa.jobs SET errors = jsonb_build_array(jsonb_build_object("
        "'error', $2::text, 'attempt', 1, 'at', now()), jsonb_build_object("
        "'error', 'short', 'attempt', 2, 'at', now())) WHERE id = $1", job.id, huge) \
        == "UPDATE 1"
    async with serving(ui_app(client=client)) as base:
        status, detail = await call(f"{base}/api/jobs/{job.id}")
        assert status == 200
        errors = [e["error"] for e in detail["job"]["errors"]]
        assert len(errors[0]) <= states.ERROR_TEXT_MAX and errors[0].startswith("yyy")
        assert errors[1] == "short"
        assert detail["truncated"] == {"errors": len(huge)}
        details = [e["detail"] for e in detail["timeline"] if e["event"].endswith("error")]
        assert all(len(d) <= states.ERROR_TEXT_MAX for d in details)
        status, whole = await call(f"{base}/api/jobs/{job.id}?full=1")
        assert whole["job"]["errors"][0]["error"] == huge and whole["truncated"] == {}


# -- a worker process -------------------------------------------------------------------

@contextmanager
def _worker(database_url: str, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``awa worker tests.apps.handler_app:client`` on queue ``handler``, its log in ``log``."""
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awa", "worker", "tests.apps.handler_app:client",
             "--queue", "handler=4", *[f"--set={k}={v}" for k, v in FAST.items()], *extra],
            env=env, cwd=ROOT, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _exited(proc: subprocess.Popen[bytes], timeout: float = EXIT_BOUND) -> int:
    try:
        return await asyncio.to_thread(proc.wait, timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not exit within {timeout} s") from None


async def _running(client: awa.AsyncClient, job_id: int) -> None:
    await wait_for_state(client, job_id, awa.JobState.Running, timeout=30)


async def test_sys_exit_and_keyboard_interrupt_fail_the_attempt(
        client: awa.AsyncClient, database_url: str, tmp_path: Path) -> None:
    """Before: the first of these ended the worker process, its job left running."""
    jobs: list[tuple[Any, str]] = []
    with _worker(database_url, tmp_path / "worker.log") as proc:
        for how, name in (("sys.exit", "SystemExit: 3"), ("exit", "SystemExit: bye"),
                          ("keyboard", "KeyboardInterrupt")):
            for sync in (False, True):
                kind = "exits_sync" if sync else "exits_async"
                job = await client.insert({"how": how, "sync": sync}, kind=kind,
                                          queue="handler", max_attempts=1)
                jobs.append((job, name))
        for job, name in jobs:
            done = await wait_for_state(client, job.id, awa.JobState.Failed, timeout=30)
            assert done.errors[-1]["error"].startswith(name), done.errors
        assert proc.poll() is None, "the worker process died"
        after = await client.insert(sleep_args(0), kind="sync_sleep", queue="handler")
        await wait_for_state(client, after.id, awa.JobState.Completed, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert await _exited(proc) == 0


async def test_sigterm_honours_the_shutdown_timeout_with_a_sync_handler(
        client: awa.AsyncClient, database_url: str, tmp_path: Path) -> None:
    """Before: the process waited for the handler's thread however long it ran."""
    with _worker(database_url, tmp_path / "worker.log", "--shutdown-timeout-ms", "300") as proc:
        job = await client.insert(sleep_args(FOREVER), kind="sync_sleep", queue="handler")
        await _running(client, job.id)
        proc.send_signal(signal.SIGTERM)
        assert await _exited(proc) == 0
    # Abandoned: still running in the database, for rescue to retry.
    assert (await client.get_job(job.id)).state is awa.JobState.Running
    assert "sync handlers still running" in (tmp_path / "worker.log").read_text()


async def test_a_sync_handler_finishing_within_the_timeout_is_written(
        client: awa.AsyncClient, database_url: str, tmp_path: Path) -> None:
    with _worker(database_url, tmp_path / "worker.log",
                 "--shutdown-timeout-ms", str(int(EXIT_BOUND * 1000))) as proc:
        job = await client.insert(sleep_args(1.0), kind="sync_sleep", queue="handler")
        await _running(client, job.id)
        proc.send_signal(signal.SIGTERM)
        assert await _exited(proc) == 0
    done = await client.get_job(job.id)
    assert done.state is awa.JobState.Completed and done.output == {"slept": 1.0}


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
async def test_a_second_signal_exits_at_once(client: awa.AsyncClient, database_url: str,
                                             tmp_path: Path, second: signal.Signals) -> None:
    """Before: a second signal was ignored; the process waited out the handler."""
    log = tmp_path / "worker.log"
    with _worker(database_url, log, "--shutdown-timeout-ms", str(int(FOREVER * 1000))) as proc:
        job = await client.insert(sleep_args(FOREVER), kind="sync_sleep", queue="handler")
        await _running(client, job.id)
        proc.send_signal(signal.SIGTERM)

        async def shutting_down() -> bool:
            return "shutting down" in log.read_text()
        await wait_until(shutting_down, timeout=30, message="the worker to begin shutdown")
        proc.send_signal(second)
        assert await _exited(proc) == 128 + second
    assert "second signal" in log.read_text()
    assert (await client.get_job(job.id)).state is awa.JobState.Running
