"""A TCP proxy that can turn its connections half-open (stop forwarding, never close).

`HalfOpenProxy` forwards 127.0.0.1:<port> to a PostgreSQL server. `freeze()`
black-holes the connections open at that moment (optionally only those whose
startup packet names a given ``application_name``): bytes in either direction
are read and dropped, sockets stay open, no FIN or RST is ever sent, as when a
NAT or firewall silently forgets a flow. Connections made afterwards work.

A connection's ``application_name`` is known once its whole startup packet went
through (after an optional SSLRequest or GSSENCRequest the server declined): until
then, and for a cancel request or an encrypted session, it is None, and a freeze or
count by name leaves it out (a connection still starting is no LISTEN connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from dataclasses import dataclass, field

#: Protocol 3.0's startup packet code; the 8-byte requests that may come before it.
_PROTOCOL_3 = 196608
_ENCRYPTION_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest
#: Bytes of a connection's first client data kept to read its startup packet from.
_HEAD_MAX = 16384


def _startup_application_name(head: bytes) -> str | None:
    """The ``application_name`` of the startup packet at the start of ``head`` ("" if the
    packet names none), or None while the packet is incomplete or is none."""
    while True:
        if len(head) < 8:
            return None
        length, code = struct.unpack("!ii", head[:8])
        if code in _ENCRYPTION_REQUESTS and length == 8:
            head = head[8:]  # declined (else the rest is encrypted, and never parses)
            continue
        if code != _PROTOCOL_3 or length < 8 or len(head) < length:
            return None  # a cancel request, or the packet is not all here yet
        fields = head[8:length].split(b"\x00")
        params = dict(zip(fields[0::2], fields[1::2], strict=False))
        return params.get(b"application_name", b"").decode(errors="replace")


@dataclass(eq=False)
class _Flow:
    head: bytearray = field(default_factory=bytearray)
    frozen: bool = False
    opened_at: float = field(default_factory=time.monotonic)
    #: From the startup packet; None until it has been seen whole.
    application_name: str | None = None

    def saw(self, data: bytes) -> None:
        """Client bytes on their way to the server: read the startup packet from them."""
        if self.application_name is None and len(self.head) < _HEAD_MAX:
            self.head += data[: _HEAD_MAX - len(self.head)]
            self.application_name = _startup_application_name(bytes(self.head))

    def named(self, application_name: str | None) -> bool:
        """Any flow if ``application_name`` is None, else only one whose startup packet
        (seen whole) names it."""
        return application_name is None or self.application_name == application_name


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
        self._freeze_on_reply = False

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
                if flow.named(application_name):
                    if not flow.frozen:
                        flow.frozen = True
                        n += 1
        return n

    def freeze_on_reply(self) -> None:
        """Black-hole every open connection the moment the server next answers one of
        them: the server has read the client's last message, and the client never sees
        the answer (nor can it send anything more)."""
        self._freeze_on_reply = True

    def live(self, application_name: str | None = None) -> int:
        """Open, unfrozen connections (of ``application_name`` if given)."""
        with self._lock:
            return sum(1 for f in self._flows if not f.frozen and f.named(application_name))

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
                if data and not upstream and self._freeze_on_reply:
                    self._freeze_on_reply = False
                    self.freeze()
                if flow.frozen:
                    if not data:
                        await asyncio.Event().wait()  # a black hole never closes
                    continue  # dropped
                if not data:
                    break
                if upstream:
                    flow.saw(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not flow.frozen:
                with contextlib.suppress(Exception):
                    dst.close()
