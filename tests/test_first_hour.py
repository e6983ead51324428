"""What a new user hits in the first hour (issue 31)."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import asyncpg
import pytest
from tests.helpers import FAST, ROOT, SUBPROCESS_PATH, wait_for_state, wait_until

import awa


async def test_a_missing_table_of_yours_is_not_a_missing_awa_schema(
        client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        await tx.insert({"a": 1}, kind="k")
        with pytest.raises(awa.DatabaseError) as err:
            await tx.execute("INSERT INTO orders (id) VALUES ($1)", 42)
    assert not isinstance(err.value, awa.SchemaNotMigrated)
    assert 'relation "orders" does not exist' in str(err.value)
    assert isinstance(err.value.__cause__, asyncpg.UndefinedTableError)


async def test_a_missing_awa_schema_still_says_migrate(empty_database_url: str) -> None:
    async with awa.AsyncClient(empty_database_url) as client:
        with pytest.raises(awa.SchemaNotMigrated, match="awa migrate"):
            await client.insert({"a": 1}, kind="k")
        async with client.transaction() as tx:
            with pytest.raises(awa.SchemaNotMigrated):
                await tx.insert({"a": 1}, kind="k")


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is New York for the test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def test_naive_run_at_is_local_time(client: awa.AsyncClient, new_york: None) -> None:
    in_ten = datetime.now() + timedelta(minutes=10)  # naive, New York wall clock
    job = await client.insert({"a": 1}, kind="k", run_at=in_ten)
    assert job.state is awa.JobState.Scheduled
    expected = datetime.now(UTC) + timedelta(minutes=10)
    assert abs(job.run_at_datetime - expected) < timedelta(seconds=5)
    assert job.run_at_datetime == datetime.fromtimestamp(in_ten.timestamp(), UTC)


async def test_job_outcomes_that_need_attention_are_logged(
        client: awa.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    @client.task(kind="flaky", queue="q")
    async def flaky(job: awa.Job) -> None:
        raise ValueError(f"secret {job.args['secret']}")

    @client.task(kind="stuck", queue="q")
    async def stuck(job: awa.Job) -> None:
        await asyncio.sleep(30)

    awa.set_log_error_messages(False)  # messages may carry data that must not reach logs
    retried = await client.insert({"secret": "hunter2"}, kind="flaky", queue="q",
                                  max_attempts=2)
    timed_out = await client.insert({"secret": "hunter2"}, kind="stuck", queue="q",
                                    max_attempts=1)
    caplog.set_level(logging.INFO, logger="awa.jobs")
    await client.start([{"name": "q", "max_workers": 4, "deadline_duration_ms": 300}], **FAST)
    try:
        await wait_for_state(client, retried.id, awa.JobState.Failed, timeout=20)
        await wait_for_state(client, timed_out.id, awa.JobState.Failed)
    finally:
        await client.shutdown(timeout_ms=200)
        awa.set_log_error_messages(None)
    records = [r for r in caplog.records if r.name == "awa.jobs"]
    lines = [(r.levelname, r.getMessage()) for r in records]
    assert ("WARNING", f"job {retried.id} (kind=flaky queue=q attempt=1/2) raised ValueError; "
                       f"retrying (details: awa job dump {retried.id})") in lines
    assert ("ERROR", f"job {retried.id} (kind=flaky queue=q attempt=2/2) failed for good "
                     f"(ValueError, attempts used up; details: awa job dump {retried.id})") \
        in lines
    rescue = [m for lvl, m in lines if m.startswith(f"job {timed_out.id} ")]
    assert rescue and "rescued: hard deadline exceeded" in rescue[0]
    assert "failed for good" in rescue[0]
    assert {(r.job_id, r.kind, r.queue) for r in records} >= {  # type: ignore[attr-defined]
        (retried.id, "flaky", "q"), (timed_out.id, "stuck", "q")}
    assert not any("hunter2" in m for _, m in lines)  # args and messages stay out of logs


def test_awa_worker_logs_json(database_url: str) -> None:
    async def insert() -> int:
        async with awa.AsyncClient(database_url) as c:
            return (await c.insert({"x": 1}, kind="nobody_has_this", queue="procs")).id
    job_id = asyncio.run(insert())
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client",
         "--queue", "procs=2", "--log-format", "json", "--log-level", "warning",
         *[f"--set={k}={v}" for k, v in FAST.items()]],
        env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            record = json.loads(line)
            assert record["level"] in ("WARNING", "ERROR", "CRITICAL")
            if record["logger"] == "awa.jobs":
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert record["job_id"] == job_id and record["kind"] == "nobody_has_this"
    assert record["queue"] == "procs" and record["attempt"] == 1
    assert "UnknownJobKind" in record["message"]


def test_worker_help_names_the_deadline() -> None:
    out = subprocess.run([sys.executable, "-m", "awa", "worker", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "5 minutes" in out and "deadline_duration_ms" in out
    assert "--log-level" in out and "--log-format" in out


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


@dataclass
class Address:
    city: str
    since: date


@dataclass
class Invoice:
    at: datetime
    due: date
    amount: Decimal
    ref: uuid.UUID
    tier: Tier
    address: Address
    lines: tuple[int, ...]
    note: str | None = None


async def test_typed_args_come_back_typed(client: awa.AsyncClient) -> None:
    sent = Invoice(at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), due=date(2026, 2, 1),
                   amount=Decimal("12.30"), ref=uuid.uuid4(), tier=Tier.GOLD,
                   address=Address("Oslo", date(2020, 5, 17)), lines=(1, 2))
    got: list[Invoice] = []

    @client.task(Invoice, queue="q")
    async def handle(job: awa.Job) -> None:
        got.append(job.args)

    job = await client.insert(sent, queue="q")
    await client.start([("q", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, awa.JobState.Completed)
    finally:
        await client.shutdown()
    assert got == [sent]
    assert isinstance(got[0].amount, Decimal) and isinstance(got[0].address, Address)


@dataclass
class SendEmail:
    to: str


@dataclass
class Audit:
    note: str


async def test_jobs_go_to_the_queue_their_task_serves(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection) -> None:
    @client.task(SendEmail, queue="email")
    async def send(job: awa.JobContext) -> None:
        job.enqueue_on_completion(Audit("sent"))           # no queue: Audit's task's queue

    @client.task(Audit, queue="audit")
    async def audit(job: awa.Job) -> None:
        return None

    client.periodic("mail", "0 * * * *", SendEmail, SendEmail("cron@example.com"))
    assert (await client.insert(SendEmail("a"))).queue == "email"
    assert (await client.insert({"to": "b"}, kind="send_email")).queue == "email"
    assert (await client.insert(SendEmail("c"), queue="urgent")).queue == "urgent"  # wins
    assert (await client.insert({"x": 1}, kind="unregistered")).queue == "default"
    many = await client.insert_many_copy([SendEmail("d"), Audit("e")],
                                         opts=[None, {"queue": "other"}])
    assert [j.queue for j in many] == ["email", "other"]
    assert await client.enqueue_many_copy([SendEmail("f"), Audit("g")]) == 2
    async with client.transaction() as tx:
        assert (await tx.insert(Audit("h"))).queue == "audit"
    counts = {r["queue"]: r["n"] for r in await conn.fetch(
        "SELECT queue, count(*) AS n FROM awa.jobs GROUP BY queue")}
    assert counts == {"email": 4, "audit": 2, "urgent": 1, "default": 1, "other": 1}

    await client.start([("email", 2)], **FAST)
    try:
        assert await conn.fetchval("SELECT queue FROM awa.cron_jobs WHERE name = 'mail'") \
            == "email"
        await wait_until(lambda: conn.fetchval(
            "SELECT count(*) = 6 FROM awa.jobs WHERE kind = 'audit' AND queue = 'audit'"))
    finally:
        await client.shutdown()


async def test_a_worker_warns_once_about_its_kinds_in_unserved_queues(
        client: awa.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    @client.task(SendEmail, queue="email")
    async def send(job: awa.Job) -> None:
        return None

    await client.insert(SendEmail("a"), queue="emial")       # a typo: nobody serves it
    await client.insert({"x": 1}, kind="someone_elses", queue="elsewhere")
    caplog.set_level(logging.WARNING, logger="awa.maintenance")
    await client.start([("email", 2)], **FAST)
    try:
        runtime = client._runtime
        assert runtime is not None

        async def announced() -> bool:
            return runtime.service("presence").last_run_at is not None
        await wait_until(announced, message="this worker's presence")
        for _ in range(2):  # its first pass may have run already: still one warning
            await runtime.service("unserved").run_once()
    finally:
        await client.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "no running worker" in r.getMessage()]
    assert warnings == ["jobs of kind 'send_email' wait in queue 'emial', which no running "
                        "worker serves (this worker handles 'send_email': serve that queue, "
                        "or insert with queue=...)"]


async def test_health_without_a_worker_speaks_for_the_database(
        client: awa.AsyncClient, empty_database_url: str) -> None:
    health = await client.health_check()
    assert health.healthy and health.postgres_connected and health.schema_compatible
    assert health.runtime == "not running" and not health.poll_loop_alive
    async with awa.AsyncClient(empty_database_url) as unmigrated:
        health = await unmigrated.health_check()
    assert health.postgres_connected and not health.healthy
    assert health.schema_compatible is False

    @client.task(kind="k", queue="q")
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([("q", 1)], **FAST)
    try:
        assert (await client.health_check()).runtime == "running"
    finally:
        await client.shutdown()


async def test_partition_keys_may_be_ints(client: awa.AsyncClient) -> None:
    pq = awa.PartitionedQueue("orders", 4)
    routed = pq.route_by_key(42)
    assert routed == pq.route_by_key("42") and routed["queue"].startswith("orders")
    assert pq.route_by_key(uuid.UUID(int=7)) == pq.route_by_key(str(uuid.UUID(int=7)))
    job = await client.insert({"a": 1}, kind="k", **routed)  # type: ignore[arg-type]
    assert job.queue == routed["queue"] and job.ordering_key == "42"
    assert pq.route_by_key(10**197)["queue"] == pq.route_by_key(str(10**197))["queue"]
    with pytest.raises(awa.ValidationError, match="at most 198 digits"):
        pq.route_by_key(10**100_000)                 # no MemoryError, no 4300-digit error
    for bad in (object(), True, 1.5):
        with pytest.raises(awa.ValidationError, match="bytes-like or str"):
            pq.route_by_key(bad)  # type: ignore[arg-type]
