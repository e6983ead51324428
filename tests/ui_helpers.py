"""Helpers for the web UI tests: serve an app on a real port, call its API,
and fill a database with jobs in every state through a real worker."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from tests.helpers import FAST, wait_until

import awa


@asynccontextmanager
async def serving(app: Any, *, lifespan: bool = False) -> AsyncIterator[str]:
    """Run ``app`` with uvicorn on a free local port; yields its base URL.

    With ``lifespan``, the app's own startup and shutdown run (an app whose
    lifespan starts a client or a worker)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on" if lifespan else "off"))
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: _started(server), timeout=10, message="uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        state = getattr(getattr(app, "state", None), "awa", None)
        if state is not None:
            await state.close()  # lifespan is off: close a client the app made itself


async def _started(server: uvicorn.Server) -> bool:
    return server.started


async def call(url: str, body: Any = None, *, token: str | None = None,
               csrf: bool = True) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON) ``url``; returns (status, parsed JSON)."""
    def go() -> tuple[int, Any]:
        headers = {"accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
            if csrf:
                headers["x-awa-request"] = "1"
        if token:
            headers["authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=data, headers=headers,
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")
    return await asyncio.to_thread(go)


@dataclass
class Email:
    to: str


@dataclass
class Report:
    pages: int


@dataclass
class Signature:
    document: str


@dataclass
class Seeded:
    failed_id: int
    waiting_id: int
    completed_id: int
    available_id: int


async def seed(client: awa.AsyncClient) -> Seeded:
    """Jobs in every interesting state, made by a real worker in this process:
    completed (with output and progress), failed (with a traceback), waiting
    for callback #1, available in a second queue, plus a cron schedule."""

    @client.task(Email, queue="email")
    async def send(job: awa.Job) -> object:
        if job.args.to.startswith("bounce"):
            raise awa.TerminalError(f"mailbox {job.args.to} does not exist")
        job.set_progress(100, "sent")
        return awa.Output({"delivered": job.args.to})

    @client.task(Signature, queue="email")
    async def sign(job: awa.Job) -> object:
        token = await job.register_callback(timeout_seconds=3600)
        return awa.WaitForCallback(token)

    client.periodic("nightly", "0 3 * * *", Report, Report(pages=3), queue="reports")
    done = await client.insert(Email("ada@example.com"), queue="email", tags=["vip"])
    failed = await client.insert(Email("bounce@example.com"), queue="email")
    waiting = await client.insert(Signature("contract-7"), queue="email")
    available = await client.insert(Report(pages=2), kind="report", queue="reports")
    await client.start([("email", 4)], **FAST)

    async def settled() -> bool:
        states = [(await client.get_job(i)).state for i in (done.id, failed.id, waiting.id)]
        return states == [awa.JobState.Completed, awa.JobState.Failed,
                          awa.JobState.WaitingExternal]
    await wait_until(settled, message="seed jobs to settle")
    return Seeded(failed.id, waiting.id, done.id, available.id)
