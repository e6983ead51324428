"""The worker's health: what `client.health_check()` reports, and the listener
serving ``/healthz``, ``/readyz`` and ``/metrics``.

`WorkerHealth` computes the answers from the runtime's parts. The listener
is enabled by ``start(health_addr="host:port")`` or ``$AWA_HEALTH_ADDR``: a tiny
asyncio HTTP server with no dependencies, so orchestrators can probe a
worker: ``/healthz`` answers 200 while the process lives (draining
included); ``/readyz`` answers 200 when the database is reachable, the schema
matches this code and the loops are alive, else 503 naming what failed;
``/metrics`` is the Prometheus text format.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from awa.core import states
from awa.db import migrations
from awa.db.listener import Listener
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.maintenance.leader import LeaderElection
from awa.worker.attempts import Attempts
from awa.worker.capacity import Capacity
from awa.worker.config import RuntimeConfig, parse_addr
from awa.worker.dispatcher import Dispatcher

log = logging.getLogger("awa.health")
MAX_REQUEST = 8192


@dataclass(frozen=True, slots=True)
class QueueHealth:
    """One queue as this process serves it."""

    in_flight: int
    available: int
    max_workers: int
    min_workers: int
    weight: int
    #: Claims that failed in a row (`CLAIM_FAILURES_UNHEALTHY` makes the worker
    #: unhealthy), and the last failure's error.
    claim_failures: int = 0
    last_claim_error: str | None = None

    @property
    def claims_failing(self) -> bool:
        """Its claims failed often enough in a row to make the worker unhealthy."""
        return self.claim_failures >= states.CLAIM_FAILURES_UNHEALTHY


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """What `health_check()` reports: the process and each of its queues."""

    healthy: bool
    postgres_connected: bool
    poll_loop_alive: bool
    heartbeat_alive: bool
    shutting_down: bool
    leader: bool
    queues: dict[str, QueueHealth] = field(default_factory=dict)
    listen_enabled: bool = False
    #: "running", "shutting down", or "not running" (no worker started in this
    #: process: then ``healthy`` speaks for the database and schema alone).
    runtime: str = "running"
    schema_compatible: bool | None = None  #: checked only when no worker runs


@dataclass(slots=True)
class WorkerHealth:
    """The health of one worker process, read from its parts."""

    pool: asyncpg.Pool
    q: Queries
    config: RuntimeConfig
    instance_id: str
    dispatchers: Mapping[str, Dispatcher]
    capacity: Capacity
    attempts: Attempts
    heartbeat: PeriodicService
    leader: LeaderElection
    listener: Listener
    #: Set when the worker stops claiming (shutdown began), and when its services stop.
    claiming_stopped: asyncio.Event
    services_stopped: asyncio.Event

    async def check(self) -> HealthCheck:
        """Database, loops, heartbeat and claims: `client.health_check()`."""
        try:
            await self.pool.fetchval("SELECT 1")
            connected = True
        except Exception:
            connected = False
        now = time.monotonic()
        poll_limit = max(5.0, self.config.poll_interval.total_seconds() * 10)
        poll_alive = not self.claiming_stopped.is_set() and all(
            now - d.last_loop_at < poll_limit or self.capacity.free(n) == 0
            for n, d in self.dispatchers.items())
        hb = self.heartbeat
        hb_alive = not self.services_stopped.is_set() and hb.last_run_at is not None and (
            now - hb.last_run_at < hb.interval * 3)
        available: dict[str, int] = {}
        if connected:
            rows = await self.pool.fetch(self.q["queue_available_counts"],
                                         list(self.dispatchers))
            available = {r["queue"]: r["n"] for r in rows}
        in_flight = self.attempts.per_queue()
        queues = {
            qc.name: QueueHealth(
                in_flight=in_flight[qc.name], available=available.get(qc.name, 0),
                max_workers=self.capacity.limit(qc.name), min_workers=qc.min_workers,
                weight=qc.weight, claim_failures=self.dispatchers[qc.name].claim_failures,
                last_claim_error=self.dispatchers[qc.name].last_claim_error)
            for qc in self.config.queues}
        claiming = not any(h.claims_failing for h in queues.values())
        stopping = self.claiming_stopped.is_set()
        return HealthCheck(
            healthy=connected and poll_alive and hb_alive and claiming and not stopping,
            postgres_connected=connected, poll_loop_alive=poll_alive, heartbeat_alive=hb_alive,
            shutting_down=stopping, leader=self.leader.is_leader, queues=queues,
            listen_enabled=self.listener.listening,
            runtime="shutting down" if stopping else "running")

    def liveness(self) -> dict[str, Any]:
        """``/healthz``: alive while the process is (draining included)."""
        return {"alive": True, "shutting_down": self.claiming_stopped.is_set(),
                "instance": self.instance_id}

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: ready, and what each part says."""
        health = await self.check()
        schema_ok = False
        if health.postgres_connected:
            try:
                async with self.pool.acquire() as conn:
                    await migrations.check(conn, self.q.schema)
                schema_ok = True
            except Exception:
                schema_ok = False
        fields = {"postgres_connected": health.postgres_connected,
                  "schema_compatible": schema_ok, "poll_loop_alive": health.poll_loop_alive,
                  "heartbeat_alive": health.heartbeat_alive,
                  "claims_ok": not any(h.claims_failing for h in health.queues.values()),
                  "shutting_down": health.shutting_down}
        ok = all(v for k, v in fields.items() if k != "shutting_down") \
            and not health.shutting_down
        failing = {name: h.last_claim_error for name, h in health.queues.items()
                   if h.claims_failing}
        return ok, {"ready": ok, **fields, **({"failing_queues": failing} if failing else {})}


class HealthServer:
    """Serves the three endpoints from callbacks into the runtime."""

    def __init__(self, addr: str, live: Callable[[], dict[str, Any]],
                 ready: Callable[[], Awaitable[tuple[bool, dict[str, Any]]]],
                 metrics: Callable[[], str]) -> None:
        self.host, self.port = parse_addr(addr)
        self._live, self._ready, self._metrics = live, ready, metrics
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("health listener on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            if len(head) > MAX_REQUEST:
                raise ValueError("request too large")
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, ctype, body = await self._route(method, path.split("?", 1)[0])
        except Exception:
            status, ctype, body = 400, "text/plain", b"bad request\n"
        writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                     f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        try:
            await writer.drain()
        finally:
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"use GET\n"
        if path == "/healthz":
            return 200, "application/json", json.dumps(self._live()).encode()
        if path == "/readyz":
            ok, fields = await self._ready()
            return (200 if ok else 503), "application/json", json.dumps(fields).encode()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self._metrics().encode()
        return 404, "text/plain", b"not found\n"
