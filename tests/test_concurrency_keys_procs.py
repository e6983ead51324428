"""Per-key concurrency across worker PROCESSES, with kills and restarts.

Several ``awa worker`` processes (tests/apps/worker_app.py, queue ``procs``)
drain jobs with random keys and limits while the test SIGKILLs one now and
then and starts a replacement. A sampler on its own connection reads the jobs
running per key from ``awa.jobs`` in a tight loop; the bound must hold in
every sample, including while a killed process's attempts still hold their
slots (until rescue frees them). Afterwards every job has completed and ran
at least once (more than once only as at-least-once delivery allows: after a
kill).

The short version runs in the normal suite (< 30 s); AWA_CHAOS=1 runs a
longer one with more processes, jobs and kills, for one seed (CI's budget)
or the seeds in ``AWA_CHAOS_SEEDS`` (``1,2,3`` ran in 87 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import spawn_worker, wait_until
from tests.test_concurrency_keys import Sampler

import awa


@dataclass
class Sleepy:  # the worker app's task (kind "sleepy", queue "procs")
    seconds: float
    marker: str = ""


async def _run(database_url: str, *, processes: int, jobs: int, keys: int, kills: int,
               seed: int, timeout: float) -> None:
    rng = random.Random(seed)
    limits = {f"tenant-{i}": rng.randint(1, 4) for i in range(keys)}
    conn = await asyncpg.connect(database_url)
    await conn.execute("CREATE TABLE runs (job_id bigint, attempt int, pid int)")
    names = list(limits)
    async with awa.AsyncClient(database_url) as client:
        batch = [Sleepy(rng.uniform(0.005, 0.05)) for _ in range(jobs)]
        opts = [{"concurrency_key": (k := rng.choice(names)), "max_in_flight": limits[k]}
                for _ in batch]
        await client.enqueue_many_copy(batch, opts=opts, queue="procs")
    procs: list[subprocess.Popen[bytes]] = [spawn_worker(database_url, workers=6)
                                            for _ in range(processes)]
    sampler = Sampler(database_url)
    killed = 0
    try:
        with sampler:
            while killed < kills:
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                victim = procs.pop(rng.randrange(len(procs)))
                victim.kill()
                victim.wait()
                killed += 1
                procs.append(spawn_worker(database_url, workers=6))

            async def drained() -> bool:
                return await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
            await wait_until(drained, timeout=timeout, interval=0.2,
                             message="every job to finish")
            await sampler.stop()
        over = {k: n for k, n in sampler.peak.items() if n > limits[k]}
        assert not over, f"keys over their limit: {over} (limits {limits})"
        assert sampler.samples > 50
        assert sum(sampler.peak.get(k) == n > 1 for k, n in limits.items()) >= 2
        states = await conn.fetch("SELECT state::text, count(*) FROM awa.jobs_done GROUP BY 1")
        assert {r[0]: r[1] for r in states} == {"completed": jobs}
        unrun = await conn.fetchval("SELECT count(*) FROM awa.jobs_done d WHERE NOT EXISTS "
                                    "(SELECT 1 FROM runs r WHERE r.job_id = d.id)")
        assert unrun == 0
        # Runs beyond one per job come only from attempts a kill interrupted:
        # each such job was rescued, so it has more than one attempt.
        extra = await conn.fetch("SELECT job_id FROM runs GROUP BY job_id HAVING count(*) > 1")
        if extra:
            attempts = await conn.fetch("SELECT id, attempt FROM awa.jobs_done "
                                        "WHERE id = ANY($1::bigint[])",
                                        [r[0] for r in extra])
            assert all(r["attempt"] > 1 for r in attempts)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        await conn.close()


async def test_bound_holds_across_processes_with_kills(database_url: str) -> None:
    await _run(database_url, processes=3, jobs=400, keys=12, kills=2, seed=11, timeout=25)


@pytest.mark.chaos
@pytest.mark.skipif(os.environ.get("AWA_CHAOS") != "1", reason="set AWA_CHAOS=1")
@pytest.mark.parametrize(
    "seed", [int(s) for s in os.environ.get("AWA_CHAOS_SEEDS", "1").split(",")])
async def test_chaos_bound_holds_across_processes(database_url: str, seed: int) -> None:
    await _run(database_url, processes=5, jobs=3000, keys=40, kills=10, seed=seed,
               timeout=120)
