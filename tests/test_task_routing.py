"""Task routing: a job without a queue goes to the queue its task serves, and a
worker warns once about its kinds waiting in queues no worker serves."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import FAST, wait_until

import awa


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
        "SELECT queue, count(*) AS n FROM awa.jobs_all GROUP BY queue")}
    assert counts == {"email": 4, "audit": 2, "urgent": 1, "default": 1, "other": 1}

    await client.start([("email", 2)], **FAST)
    try:
        assert await conn.fetchval("SELECT queue FROM awa.cron_jobs WHERE name = 'mail'") \
            == "email"
        await wait_until(lambda: conn.fetchval(
            "SELECT count(*) = 6 FROM awa.jobs_all WHERE kind = 'audit' AND queue = 'audit'"))
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


