"""A worker application for the handler-robustness tests (issue 40 item 5):
``awa worker tests.apps.handler_app:client``."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass

import awa

client = awa.AsyncClient(os.environ["DATABASE_URL"])


@dataclass
class SyncSleep:
    seconds: float


@client.task(SyncSleep, queue="handler")
def sync_sleep(job: awa.JobContext) -> awa.Output:
    time.sleep(job.args.seconds)
    return awa.Output({"slept": job.args.seconds})


@dataclass
class Exits:
    how: str  # "exit", "sys.exit", "keyboard"
    sync: bool


def _raise(how: str) -> None:
    if how == "sys.exit":
        sys.exit(3)
    if how == "exit":
        raise SystemExit("bye")
    raise KeyboardInterrupt


@client.task(Exits, queue="handler", kind="exits_async")
async def exits_async(job: awa.JobContext) -> None:
    await asyncio.sleep(0)
    _raise(job.args.how)


@client.task(Exits, queue="handler", kind="exits_sync")
def exits_sync(job: awa.JobContext) -> None:
    _raise(job.args.how)
