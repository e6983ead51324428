"""A tour of Awa on the embedded PostgreSQL (or $DATABASE_URL).

Run: python examples/demo.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import awa


@dataclass
class SendEmail:
    to: str
    subject: str


async def main() -> None:
    async with awa.AsyncClient() as client:
        applied = await client.migrate()
        print(f"schema ready (applied migrations: {applied or 'none'})")
        await client.drain_queue("demo")

        job = await client.insert(SendEmail("ada@example.com", "Welcome"), queue="demo",
                                  tags=["welcome"])
        print(f"inserted job {job.id}: kind={job.kind} state={job.state}")

        count = await client.enqueue_many_copy(
            [SendEmail(f"user{i}@example.com", "Digest") for i in range(1000)], queue="demo")
        print(f"bulk-inserted {count} jobs with COPY")

        later = await client.insert(SendEmail("bob@example.com", "Reminder"), queue="demo",
                                    run_at=datetime.now(UTC) + timedelta(hours=1))
        print(f"scheduled job {later.id} for {later.run_at:%H:%M} UTC: state={later.state}")

        await client.insert(SendEmail("eve@example.com", "Once"), queue="demo",
                            unique_opts={"by_queue": True})
        try:
            await client.insert(SendEmail("eve@example.com", "Once"), queue="demo",
                                unique_opts={"by_queue": True})
        except awa.UniqueConflict as exc:
            print(f"duplicate refused: {exc}")

        async with client.transaction() as tx:
            await tx.insert(SendEmail("tx@example.com", "Atomic"), queue="demo")
            print("inserted inside a transaction (visible at commit)")

        try:
            await client.insert(SendEmail("x", "y"), priority=9)
        except awa.ValidationError as exc:
            print(f"bad input refused before writing: {exc}")

        for stat in await client.queue_stats():
            if stat.queue == "demo":
                print(f"queue demo: available={stat.available} scheduled={stat.scheduled} "
                      f"lag={stat.lag_seconds or 0:.2f}s")
        print(f"drained {await client.drain_queue('demo')} jobs from queue demo")


if __name__ == "__main__":
    asyncio.run(main())
