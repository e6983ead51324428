"""The worker's health listener: ``/healthz``, ``/readyz`` and ``/metrics``.

Enabled by ``start(health_addr="host:port")`` or ``$AWA_HEALTH_ADDR``. A tiny
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
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("awa.health")
MAX_REQUEST = 8192


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (port 0 picks a free one) → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"health address {addr!r} is not host:port")
    return host or "127.0.0.1", int(port)


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
