"""The chaos suite, short form (``AWA_CHAOS_JOBS`` jobs per scenario, default 1,500).

The long form: ``python -m tests.chaos --long`` (50,000 jobs per scenario, table in
bench/results/chaos.md). Timings are reported, never asserted; invariants are.
"""

from __future__ import annotations

import os

import pytest
from tests.chaos import scenarios
from tests.chaos.harness import Report, chaos_jobs
from tests.chaos.pgcluster import PrivateCluster

pytestmark = [pytest.mark.chaos, pytest.mark.skipif(
    os.environ.get("AWA_CHAOS", "") not in ("1", "true", "yes"),
    reason="the chaos suite takes minutes: AWA_CHAOS=1 runs its short form (CI does)")]
JOBS = chaos_jobs(1500)


def _ok(report: Report) -> None:
    print(report.line())
    assert not report.violations, "\n".join(report.violations)


async def test_sigkill_workers(database_url: str) -> None:
    _ok(await scenarios.sigkill(database_url, JOBS))


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_postgres_restart(private_cluster: PrivateCluster, mode: str) -> None:
    url = await _private_db(private_cluster, f"chaos_restart_{mode}")
    _ok(await scenarios.pg_restart(private_cluster, url, JOBS, mode))


async def test_postgres_restart_immediate_while_draining(
        private_cluster: PrivateCluster) -> None:
    """Run leases never repeat across crashes: no (job, lease) pair starts twice."""
    url = await _private_db(private_cluster, "chaos_restart_drain")
    report = await scenarios.pg_restart_drain(private_cluster, url, JOBS * 4)
    _ok(report)
    assert report.notes["starts"] >= JOBS * 4, report.notes


async def test_terminate_backends(database_url: str) -> None:
    _ok(await scenarios.terminate_backends(database_url, JOBS))


async def test_pool_exhausted_by_stuck_handler(database_url: str) -> None:
    _ok(await scenarios.pool_exhausted(database_url, JOBS))


@pytest.mark.parametrize("target", ["all", "listen"])
async def test_half_open_connections(database_url: str, target: str) -> None:
    _ok(await scenarios.half_open(database_url, JOBS, target))


async def test_held_xmin_horizon(database_url: str) -> None:
    _ok(await scenarios.held_xmin(database_url, JOBS, hold_s=8))


async def test_leader_killed_during_cron(database_url: str) -> None:
    _ok(await scenarios.leader_kill_cron(database_url, JOBS))


async def test_leader_killed_during_rescue(database_url: str) -> None:
    _ok(await scenarios.leader_kill_rescue(database_url, JOBS))


async def test_clock_skew(database_url: str) -> None:
    _ok(await scenarios.clock_skew(database_url, JOBS))


async def test_recovery_time_with_default_settings(database_url: str) -> None:
    report = await scenarios.recovery_time_defaults(database_url)
    _ok(report)
    assert report.notes.get("rescued_jobs"), report.notes
    # Generous sanity bound; the documented bound is staleness + one rescue scan.
    assert report.recovery_s is not None and report.recovery_s < 120


async def _private_db(cluster: PrivateCluster, name: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(cluster.url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return cluster.url.rsplit("/", 1)[0] + "/" + name
