"""A tour of Awa on the embedded PostgreSQL (or $DATABASE_URL).

Enqueues a batch of jobs (some fail and retry, one fails for good, some are
scheduled, one is unique), runs a worker in this process until the batch is
done, and prints what happened. Run: python examples/demo.py
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import awa

QUEUE = "demo"


@dataclass
class SendEmail:
    to: str
    subject: str
    flaky: bool = False  # fails on its first attempt, succeeds on retry
    broken: bool = False  # always fails terminally


async def main() -> None:
    async with awa.AsyncClient() as client:
        applied = await client.migrate()
        print(f"schema ready (applied migrations: {applied or 'none'})")
        await client.drain_queue(QUEUE)  # an interrupted earlier run's leftovers
        try:
            await tour(client)
        finally:
            await client.drain_queue(QUEUE)  # nothing left waiting, however this run ends


async def tour(client: awa.AsyncClient) -> None:
    """Enqueue, run and report; every run of the demo is independent of the last."""
    run = uuid.uuid4().hex[:8]  # the unique job's key includes it: each run has its own

    @client.task(SendEmail, queue=QUEUE)
    async def send_email(job: awa.Job) -> object:
        email = job.args
        if email.broken:
            raise awa.TerminalError(f"mailbox {email.to} does not exist")
        if email.flaky and job.attempt == 1:
            return awa.RetryAfter(0.5)  # e.g. the SMTP server said "try later"
        return None

    started = time.monotonic()
    ids = [j.id for j in await client.insert_many_copy(
        [SendEmail(f"user{i}@example.com", "Digest", flaky=i % 50 == 0)
         for i in range(500)], queue=QUEUE)]
    print(f"bulk-inserted {len(ids)} jobs with COPY (every 50th fails once, then retries)")
    ids.append((await client.insert(SendEmail("nobody@invalid", "Bounce", broken=True),
                                    queue=QUEUE, max_attempts=3)).id)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    ids.append((await client.insert(SendEmail("bob@example.com", "Reminder"),
                                    queue=QUEUE, run_at=soon)).id)
    once = SendEmail("eve@example.com", f"Welcome (run {run})")
    ids.append((await client.insert(once, queue=QUEUE, unique_opts={"by_queue": True})).id)
    try:
        await client.insert(once, queue=QUEUE, unique_opts={"by_queue": True})
    except awa.UniqueConflict as exc:
        print(f"duplicate refused: {exc}")
    async with client.transaction() as tx:
        ids.append((await tx.insert(SendEmail("tx@example.com", "Atomic"),
                                    queue=QUEUE)).id)
    try:
        await client.insert(SendEmail("x", "y"), priority=9)
    except awa.ValidationError as exc:
        print(f"bad input refused before writing: {exc}")

    await client.start([(QUEUE, 32)], promote_interval_ms=100)
    print("worker started: 32 concurrent handlers on queue 'demo'")
    terminal = {awa.JobState.Completed, awa.JobState.Failed, awa.JobState.Cancelled}
    while True:
        stats = {s.queue: s for s in await client.queue_stats()}.get(QUEUE)
        if stats and stats.total_queued + stats.running == 0:
            break
        await asyncio.sleep(0.2)
    await client.shutdown()
    elapsed = time.monotonic() - started

    jobs = [await client.get_job(i) for i in ids]
    states = Counter(str(j.state) for j in jobs)
    retried = sum(1 for j in jobs if j.attempt > 1)
    print(f"done in {elapsed:.1f}s: {dict(states)}; {retried} jobs needed a retry")
    failed = next(j for j in jobs if j.state is awa.JobState.Failed)
    print(f"job {failed.id} failed for good: {failed.errors[-1]['error'].splitlines()[0]}")
    assert all(j.state in terminal for j in jobs)


if __name__ == "__main__":
    awa.run(main())
