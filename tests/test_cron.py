"""Cron: validation, timezones and DST, missed-fire policies, admin, exactly-once firing."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from tests.helpers import FAST, spawn_worker, wait_until

import awa
from awa.db.queries import queries
from awa.maintenance.cron import CronService, fire_times


@dataclass
class Report:
    name: str = "daily"


def test_invalid_declarations_raise_immediately() -> None:
    client = awa.AsyncClient("postgresql://unused/db")
    with pytest.raises(awa.ValidationError, match="cron_expr"):
        client.periodic("a", "not cron", Report, Report())
    with pytest.raises(awa.ValidationError, match="cron_expr"):
        client.periodic("a", "61 * * * *", Report, Report())
    with pytest.raises(awa.ValidationError, match="cron_expr"):
        client.periodic("a", "* * * *", Report, Report())
    with pytest.raises(awa.ValidationError, match="timezone"):
        client.periodic("a", "* * * * *", Report, Report(), timezone="Mars/Olympus")
    with pytest.raises(awa.ValidationError, match="missed_fire_policy"):
        client.periodic("a", "* * * * *", Report, Report(), missed_fire_policy="later")
    with pytest.raises(awa.ValidationError, match="priority"):
        client.periodic("a", "* * * * *", Report, Report(), priority=7)
    client.periodic("five", "*/5 * * * *", Report, Report(), timezone="Europe/Paris")
    client.periodic("six", "*/10 * * * * *", Report, Report())  # seconds first


def test_dst_transitions() -> None:
    ny = ZoneInfo("America/New_York")
    start = datetime(2026, 3, 6, 12, tzinfo=ny)
    spring = fire_times("30 2 * * *", ny, start, start + timedelta(days=4))
    # 2:30 does not exist on 8 March: it fires once that day, at 3:00 EDT.
    assert [t.isoformat() for t in spring] == [
        "2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]
    start = datetime(2026, 10, 30, 12, tzinfo=ny)
    autumn = fire_times("0 9 * * *", ny, start, start + timedelta(days=4))
    # 9:00 local every day; clocks went back on 1 November, so UTC moves from 13 to 14.
    assert [t.astimezone(ny).hour for t in autumn] == [9, 9, 9, 9]
    assert [t.astimezone(UTC).hour for t in autumn] == [13, 14, 14, 14]
    assert len({t.date() for t in autumn}) == 4


async def _make_schedule(conn: asyncpg.Connection, name: str, policy: str,
                         seconds_ago: float) -> None:
    await conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args, priority, "
        "max_attempts, missed_fire_policy, last_fire_at) VALUES ($1, '* * * * * *', 'UTC', "
        "'report', 'cron', '{}', 2, 25, $2, date_trunc('second', now()) - make_interval("
        "secs => $3))", name, policy, seconds_ago)


async def test_catch_up_and_coalesce_after_an_outage(client: awa.AsyncClient,
                                                     conn: asyncpg.Connection) -> None:
    # Five one-second intervals passed while no leader ran.
    await _make_schedule(conn, "catchup", "catch_up", 5.4)
    await _make_schedule(conn, "coalesce", "coalesce", 5.4)
    service = CronService(await client.pool(), queries(), timedelta(seconds=1), lambda: True)
    await service.run_once()
    rows = await conn.fetch("SELECT metadata->>'cron_name' AS name, metadata->>'cron_fire_at' "
                            "AS at FROM awa.jobs_all ORDER BY id")
    caught = [r["at"] for r in rows if r["name"] == "catchup"]
    # Every missed second, once, without gaps (more than five if the machine is slow).
    times = [datetime.fromisoformat(t) for t in caught]
    assert len(times) >= 5
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(times))
    assert len([r for r in rows if r["name"] == "coalesce"]) == 1
    await service.run_once()  # nothing new is due within the same second
    again = await conn.fetchval("SELECT count(*) FROM awa.jobs_all")
    assert again <= len(rows) + 2


async def test_admin_of_schedules(client: awa.AsyncClient, database_url: str) -> None:
    other = awa.AsyncClient(database_url)
    client.periodic("nightly", "0 3 * * *", Report, Report(), timezone="Europe/Oslo",
                    queue="reports", tags=["cron"])
    other.periodic("hourly", "0 * * * *", Report, Report("hourly"))
    try:
        await client.start([("reports", 1)], **FAST)
        await other.start([("default", 1)], **FAST)
        listed = {c["name"]: c for c in await client.list_cron_jobs()}
        assert set(listed) == {"nightly", "hourly"}  # additive across deployments
        nightly = listed["nightly"]
        assert nightly["timezone"] == "Europe/Oslo" and nightly["queue"] == "reports"
        assert nightly["next_fire_at"].astimezone(ZoneInfo("Europe/Oslo")).hour == 3
        assert await client.pause_cron_job("nightly")
        assert {c["name"]: c for c in await client.list_cron_jobs()}["nightly"]["paused"]
        assert await client.resume_cron_job("nightly")
        job = await client.trigger_cron_job("nightly")
        assert job.metadata["cron_name"] == "nightly" and job.queue == "reports"
        assert job.tags == ["cron"] and job.args == {"name": "daily"}
        assert await client.delete_cron_job("hourly") is True
        assert await client.delete_cron_job("hourly") is False
        with pytest.raises(awa.ValidationError):
            await client.trigger_cron_job("hourly")
        assert not await client.pause_cron_job("nope")
    finally:
        await other.close()


async def test_every_second_with_three_workers_and_a_killed_leader(
        client: awa.AsyncClient, database_url: str, conn: asyncpg.Connection) -> None:
    procs = [spawn_worker(database_url, "--set=cron_interval_ms=200", workers=1,
                          env={"AWA_TEST_CRON": "1"}) for _ in range(3)]
    try:
        async def fired(n: int) -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM awa.jobs_all "
                                            "WHERE queue = 'cron_q'") >= n)
        await wait_until(lambda: fired(3), timeout=30, message="first fires")
        holder = await conn.fetchval("SELECT holder FROM awa.leadership")
        pid = int(holder.split(":")[1])
        victim = next(p for p in procs if p.pid == pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        before = await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE queue = 'cron_q'")
        await wait_until(lambda: fired(before + 4), timeout=30, message="fires after fail-over")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.to_thread(p.wait, 15)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = await conn.fetch("SELECT metadata->>'cron_fire_at' AS at FROM awa.jobs_all "
                            "WHERE queue = 'cron_q' ORDER BY 1")
    times = [datetime.fromisoformat(r["at"]) for r in rows]
    assert len(times) == len(set(times))  # exactly one job per fire time
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert set(gaps) == {1.0}  # catch_up: no fire time was skipped across the fail-over


async def test_a_schedule_this_host_cannot_read_is_reported_not_fatal(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A row naming a zone this host lacks (issue 40): listed with its error, the
    others listed and fired; the service logs it once, without a traceback."""
    from tests.test_cli import as_json, awa_cli
    from tests.ui_helpers import call, serving

    from awa.web.ui import ui_app

    await _make_schedule(conn, "good", "coalesce", 1.4)
    await _make_schedule(conn, "mars", "coalesce", 1.4)
    await conn.execute("UPDATE awa.cron_jobs SET timezone = 'Mars/Olympus' WHERE name = 'mars'")
    listed = {c["name"]: c for c in await client.list_cron_jobs()}
    assert listed["mars"]["next_fire_at"] is None
    assert "Mars/Olympus" in listed["mars"]["error"]
    assert listed["good"]["error"] is None and listed["good"]["next_fire_at"] is not None
    async with serving(ui_app(client=client)) as base:
        status, body = await call(f"{base}/api/cron")
        assert status == 200, body
        assert {c["name"]: c["error"] is None for c in body["cron"]} == {"good": True,
                                                                         "mars": False}
    rows = as_json(await asyncio.to_thread(awa_cli, database_url, "cron", "list", "--json"))
    assert {r["name"] for r in rows} == {"good", "mars"}
    table = await asyncio.to_thread(awa_cli, database_url, "cron", "list")
    assert table.returncode == 0 and "Mars/Olympus" in table.stdout, table.stderr
    service = CronService(await client.pool(), queries(), timedelta(seconds=1), lambda: True)
    with caplog.at_level("WARNING", logger="awa.cron"):
        for _ in range(3):
            await service.run_once()
    about_mars = [r for r in caplog.records if "'mars'" in r.getMessage()]
    assert len(about_mars) == 1 and about_mars[0].exc_info is None, caplog.records
    fired = await conn.fetch("SELECT DISTINCT metadata->>'cron_name' AS name FROM awa.jobs_all")
    assert [r["name"] for r in fired] == ["good"]
    # Fixed by hand: it fires again, and says so.
    await conn.execute("UPDATE awa.cron_jobs SET timezone = 'UTC' WHERE name = 'mars'")
    await service.run_once()
    assert await conn.fetchval(
        "SELECT count(*) FROM awa.jobs_all WHERE metadata->>'cron_name' = 'mars'") == 1
    assert service.broken == {}
