"""A chord inside a chain: fetch three pages side by side, sum their sizes, report.

    DATABASE_URL=postgresql://... python examples/workflows.py
"""

import asyncio
from dataclasses import dataclass

import awa

client = awa.AsyncClient()  # $DATABASE_URL, else an embedded PostgreSQL
reported = asyncio.Event()


@dataclass
class Fetch:
    url: str


@dataclass
class Total:
    label: str


@dataclass
class Report:
    to: str


@client.task(Fetch)
async def fetch(job: awa.JobContext) -> awa.Output:
    return awa.Output(len(job.args.url))  # retained on the job: its children can read it


@client.task(Total)
async def total(job: awa.JobContext) -> awa.Output:
    parents = await job.parent_outputs()  # the group's jobs, in order, with their outputs
    return awa.Output({"label": job.args.label, "bytes": sum(p.output for p in parents)})


@client.task(Report)
async def report(job: awa.JobContext) -> None:
    [summed] = await job.parent_outputs()
    print(f"{summed.output['label']}: {summed.output['bytes']} bytes, to {job.args.to}")
    reported.set()


async def main() -> None:
    async with client:
        await client.migrate()
        run = await client.enqueue_workflow(awa.chain(
            awa.chord(awa.group(Fetch("https://a.example"), Fetch("https://bb.example"),
                                Fetch("https://ccc.example")),
                      Total("pages")),
            awa.step(Report("ops@example.com"), priority=1),
        ))
        print(f"workflow of {len(run.jobs)} jobs, first job {run.id}")
        await client.start()
        await asyncio.wait_for(reported.wait(), timeout=30)
        await client.shutdown()


if __name__ == "__main__":
    awa.run(main())
