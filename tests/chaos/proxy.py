"""A TCP proxy that can turn its connections half-open (stop forwarding, never close).

`HalfOpenProxy` forwards 127.0.0.1:<port> to a PostgreSQL server. `freeze()`
black-holes the connections open at that moment (optionally only those whose
startup packet names a given ``application_name``): bytes in either direction
are read and dropped, sockets stay open, no FIN or RST is ever sent, as when a
NAT or firewall silently forgets a flow. Connections made afterwards work.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from dataclasses import dataclass, field

_APP_NAME = re.compile(rb"application_name\x00([^\x00]*)\x00")


@dataclass(eq=False)
class _Flow:
    head: bytearray = field(default_factory=bytearray)
    frozen: bool = False
    opened_at: float = field(default_factory=time.monotonic)

    @property
    def application_name(self) -> str:
        m = _APP_NAME.search(bytes(self.head))
        return m.group(1).decode() if m else ""


class HalfOpenProxy:
    """Runs its own event loop in a thread, so test code may block freely."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._flows: set[_Flow] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="chaos-proxy")
        self._server: asyncio.AbstractServer | None = None
        self._lock = threading.Lock()

    def start(self) -> HalfOpenProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        def _close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_later(0.2, self._loop.stop)
        self._loop.call_soon_threadsafe(_close)
        self._thread.join(5)

    def freeze(self, application_name: str | None = None) -> int:
        """Black-hole the open connections (only those of ``application_name`` if
        given); returns how many were frozen."""
        n = 0
        with self._lock:
            for flow in self._flows:
                if application_name is None or flow.application_name == application_name:
                    if not flow.frozen:
                        flow.frozen = True
                        n += 1
        return n

    def live(self, application_name: str | None = None) -> int:
        """Open, unfrozen connections (of ``application_name`` if given)."""
        with self._lock:
            return sum(1 for f in self._flows if not f.frozen and (
                application_name is None or f.application_name == application_name))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        flow = _Flow()
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        with self._lock:
            self._flows.add(flow)
        try:
            await asyncio.gather(self._pump(reader, up_w, flow, True),
                                 self._pump(up_r, writer, flow, False))
        except asyncio.CancelledError:
            pass  # the proxy is stopping
        finally:
            with self._lock:
                self._flows.discard(flow)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, flow: _Flow,
                    upstream: bool) -> None:
        try:
            while True:
                data = await src.read(65536)
                if flow.frozen:
                    if not data:
                        await asyncio.Event().wait()  # a black hole never closes
                    continue  # dropped
                if not data:
                    break
                if upstream and len(flow.head) < 1024:
                    flow.head += data[: 1024 - len(flow.head)]
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not flow.frozen:
                with contextlib.suppress(Exception):
                    dst.close()
