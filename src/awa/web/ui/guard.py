"""ASGI middleware in front of the UI: Host allow-list (DNS rebinding) and body cap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from awa.web.asgi import read_body, send_json

#: Request bodies the UI reads, at most (its own POSTs are a few hundred bytes).
MAX_BODY_BYTES = 1024 * 1024
#: Host names a UI without a token answers by default: this machine's loopback.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class RequestGuard:
    """ASGI middleware: refuse a ``Host`` outside ``allowed_hosts`` (DNS rebinding)
    and bodies over ``max_body`` bytes (413) before the app reads them."""

    def __init__(self, app: Any, allowed_hosts: Sequence[str] | None, max_body: int) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None or "*" in allowed_hosts \
            else {h.lower().strip("[]") for h in allowed_hosts}
        self.max_body = max_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self.allowed is not None and _host_name(headers.get("host", "")) not in self.allowed:
            await send_json(send, 400, {"error": "this host name is not allowed "
                                                 "(allowed_hosts / awa serve --allowed-host)"})
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            await send_json(send, 413, {"error": f"request body over {self.max_body} bytes"})
            return
        body: bytes | None = b""
        if scope["method"] not in ("GET", "HEAD"):  # the UI's bodies are small: read whole
            body = await read_body(receive, self.max_body)
        if body is None:
            await send_json(send, 413, {"error": f"request body over {self.max_body} bytes"})
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        await self.app(scope, replay, send)


def _host_name(host: str) -> str:
    """``Host`` header → name: ``[::1]:8600`` → ``::1``, ``Example.com:80`` → ``example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
