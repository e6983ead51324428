"""Waiting on events yields to the event loop on every Python (3.11 to 3.13).

From Python 3.12 ``asyncio.wait_for`` on an already-set event returns without
suspending; a worker loop built on it could spin and starve the tasks it
started (the jobs stayed ``running``, and the process ignored SIGINT). The
worker test runs in a subprocess with a timeout so a hang fails instead of
hanging the suite.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH

from awa.core.waiting import wait_event, wait_signal


async def test_waiting_on_a_set_event_lets_other_tasks_run() -> None:
    ran: list[str] = []
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    event.set()
    loop.call_soon(ran.append, "event")
    assert await wait_event(event, 5) is True
    assert ran == ["event"] and event.is_set()  # a flag stays set
    loop.call_soon(ran.append, "signal")
    assert await wait_signal(event, 5) is True
    assert ran == ["event", "signal"] and not event.is_set()  # a signal is consumed


async def test_waiting_times_out_or_wakes_on_set() -> None:
    event = asyncio.Event()
    assert await wait_signal(event, 0.01) is False
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_signal(event, 30) is True


_WORKER = textwrap.dedent("""
    import asyncio, dataclasses, sys
    import awa

    @dataclasses.dataclass
    class Tick:
        n: int

    async def main() -> None:
        client = awa.AsyncClient(sys.argv[1])
        done = asyncio.Event()
        seen = []

        @client.task(Tick, queue="ticks")
        async def tick(job):
            await asyncio.sleep(0)  # the event loop must also run other tasks
            seen.append(job.args.n)
            if len(seen) == int(sys.argv[3]):
                done.set()

        async with client:
            await client.insert_many([Tick(i) for i in range(int(sys.argv[3]))])
            workers = int(sys.argv[2])
            await client.start(queues=[("ticks", workers)] if workers else None,
                               poll_interval_ms=50)
            await asyncio.wait_for(done.wait(), 60)
            await asyncio.sleep(0.05)  # a plain sleep must return too
            await client.shutdown()
        print("ran", sorted(seen))

    asyncio.run(main())
""")


@pytest.mark.parametrize(("workers", "jobs"), [(1, 3), (1, 20), (0, 50), (0, 50)])
def test_a_worker_runs_its_jobs_and_stops(database_url: str, workers: int, jobs: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, database_url, str(workers), str(jobs)],
        cwd=ROOT, env={"PYTHONPATH": SUBPROCESS_PATH, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"ran {list(range(jobs))}"
