"""Shared test helpers: wait on conditions (never fixed sleeps), fast intervals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

import awa
from awa.db import migrations

#: Test setup that changes awa.jobs rows by hand: the job $1, if it is in the
#: append-only lane (the default of a new database), moves to awa.jobs first
#: (migration 0020).
TO_MUTABLE = "SELECT awa.ring_to_mutable(ARRAY[$1::bigint])"

#: start() options that make maintenance act within a fraction of a second.
FAST = {
    "poll_interval_ms": 50,
    "heartbeat_interval_ms": 100,
    "heartbeat_staleness_ms": 600,
    "heartbeat_rescue_interval_ms": 100,
    "deadline_rescue_interval_ms": 100,
    "promote_interval_ms": 50,
    "leader_election_interval_ms": 300,
}


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0,
                     interval: float = 0.02, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


async def wait_for_state(client: awa.AsyncClient, job_id: int, state: awa.JobState,
                         timeout: float = 15.0) -> awa.Job:
    """Wait until job ``job_id`` is in ``state``; returns the job."""
    async def check() -> awa.Job | None:
        job = await client.get_job(job_id)
        return job if job.state is state else None
    job: awa.Job = await wait_until(check, timeout=timeout,
                                    message=f"job {job_id} to be {state}")
    return job


ROOT = Path(__file__).resolve().parent.parent
#: PYTHONPATH for a subprocess: this checkout's package (not whichever one the
#: virtualenv installed) and its tests.
SUBPROCESS_PATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


def hold_partitions(monkeypatch: Any) -> asyncio.Event:
    """Hold a starting worker's partitions pass (the cleanup's `prepare`, which its
    jobs wait for) until the returned event is set; never, if it is not."""
    from awa.maintenance.services import Cleaner
    partitions = asyncio.Event()
    real = Cleaner.prepare

    async def held(self: Cleaner) -> None:
        await partitions.wait()
        await real(self)
    monkeypatch.setattr(Cleaner, "prepare", held)
    return partitions


def spawn_worker(database_url: str, *extra: str, workers: int = 4,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real ``awa worker`` process for ``tests.apps.worker_app`` on queue ``procs``."""
    full_env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH,
                **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client",
         "--queue", f"procs={workers}", *[f"--set={k}={v}" for k, v in FAST.items()], *extra],
        env=full_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def idle_task(client: awa.AsyncClient, queue: str = "idle") -> None:
    """Register a no-op task on ``queue``: a worker only starts with something to run
    (as in awa-pg), so maintenance-only test workers get this one."""
    if client._registry.get(f"idle_{queue}") is not None:
        return

    @client.task(kind=f"idle_{queue}", queue=queue)
    async def idle(job: Any) -> None:
        return None


async def schema_at(conn: asyncpg.Connection, version: int) -> None:
    """The awa schema as release ``version`` left it (migrations 1..version),
    recorded as applied a day ago: the starting point of an upgrade test."""
    async with conn.transaction():
        await conn.execute("CREATE SCHEMA awa")
        for _, _, sql in migrations.migrations_range(0, version):
            await conn.execute(sql)
        await conn.execute("CREATE TABLE awa.schema_migrations (version integer PRIMARY KEY, "
                           "description text NOT NULL, applied_at timestamptz NOT NULL "
                           "DEFAULT now())")
        await conn.execute("INSERT INTO awa.schema_migrations (version, description, "
                           "applied_at) SELECT g, 'old', now() - interval '1 day' "
                           "FROM generate_series(1, $1::int) g", version)


async def explain_prepared(conn: asyncpg.Connection, sql: str, arguments: str,
                           plan_mode: str = "force_generic_plan") -> dict[str, Any]:
    """The EXPLAIN JSON plan of ``sql`` prepared and executed with ``arguments`` (a
    SQL argument list) under ``plan_mode``: the plan a pooled connection would reuse."""
    await conn.execute(f"SET plan_cache_mode = {plan_mode}")
    await conn.execute(f"PREPARE explained AS {sql}")
    try:
        explained = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE explained{arguments}")
    finally:
        await conn.execute("DEALLOCATE explained")
        await conn.execute("RESET plan_cache_mode")
    plan: dict[str, Any] = explained[0]["Plan"]  # the connection decodes json
    return plan
