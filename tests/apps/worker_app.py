"""A worker application for subprocess tests: ``awa worker tests.apps.worker_app:client``."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import awa

client = awa.AsyncClient(os.environ["DATABASE_URL"])


@dataclass
class Sleepy:
    seconds: float
    marker: str = ""


@client.task(Sleepy, queue="procs")
async def sleepy(job: awa.Job) -> None:
    # Record every run, so tests can count executions per job.
    pool = await client.pool()
    await pool.execute("CREATE TABLE IF NOT EXISTS runs (job_id bigint, attempt int, pid int)")
    await pool.execute("INSERT INTO runs VALUES ($1, $2, $3)", job.id, job.attempt, os.getpid())
    await asyncio.sleep(job.args.seconds)


@dataclass
class Checkpointed:
    seconds: float


@client.task(Checkpointed, queue="procs")
async def checkpointed(job: awa.JobContext) -> None:
    job.set_progress(50, "halfway")
    job.update_metadata({"cursor": 500, "attempt_seen": job.attempt})
    await job.flush_progress()
    await asyncio.sleep(job.args.seconds)


@dataclass
class Tick:
    pass


if os.environ.get("AWA_TEST_CRON"):
    client.periodic("tick", "* * * * * *", Tick, Tick(), queue="cron_q",
                    missed_fire_policy="catch_up")
