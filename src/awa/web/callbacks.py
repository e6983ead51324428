"""HTTP ingress for external callbacks: a plain ASGI app (docs/guide/callbacks.md).

``POST {prefix}/callbacks/{id}/complete|fail|resume|heartbeat|resolve`` with
a JSON object body: ``{"payload": ...}`` for complete and resume,
``{"error": "..."}`` for fail, ``{"timeout_seconds": n}`` (optional) for
heartbeat, ``{"payload": ..., "default_action": "ignore"}`` for resolve (CEL
rules; answers ``{"outcome", "reason", "id", "state"}``). With a secret
configured, every request must carry a v2 signature of its action, callback
id, body and expiry (`awa.callback_contract.sign_request`; docs/security.md):
401 otherwise, and nothing changes. The id-only signature of awa-pg is
accepted only with ``accept_legacy_signatures=True``. Bad input never gets a
500: malformed or too deeply nested bodies get 400, bodies over 1 MiB 413,
unknown ids 404. Mount it in any ASGI server or framework.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from awa.core import callback_contract
from awa.core.errors import CallbackNotFound, DatabaseError, SerializationError, ValidationError
from awa.core.serialize import NOT_JSON, loads
from awa.web.asgi import ASGIApp, Receive, Scope, Send, read_body, send_json

if TYPE_CHECKING:
    from awa.client import AsyncClient

MAX_BODY = 1024 * 1024


def callback_app(client: AsyncClient, *, secret: bytes | str | None = None,
                 prefix: str = "/api", accept_legacy_signatures: bool = False,
                 max_signature_ttl: float = callback_contract.MAX_SIGNATURE_TTL) -> ASGIApp:
    """An ASGI app resolving callbacks through ``client`` (signed requests when ``secret``)."""
    if secret is not None:
        callback_contract.sign(secret, "check")  # validates the secret's length now
    route = re.compile("^" + re.escape(prefix.rstrip("/"))
                       + r"/callbacks/(?P<id>[^/]+)"
                       + r"/(?P<action>complete|fail|resume|heartbeat|resolve)$")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        match = route.match(scope["path"])
        if match is None:
            await send_json(send, 404, {"error": "not found"})
            return
        if scope["method"] != "POST":
            await send_json(send, 405, {"error": "use POST"})
            return
        callback_id, action = match["id"], match["action"]
        raw = await read_body(receive, MAX_BODY)
        if raw is None:
            await send_json(send, 413, {"error": "body too large"})
            return
        if secret is not None:
            headers = {k.decode("latin-1"): v.decode("latin-1")  # HTTP header bytes
                       for k, v in scope.get("headers", [])}
            refused = callback_contract.verify_request(
                secret, action, callback_id, raw, headers, max_ttl=max_signature_ttl,
                accept_legacy=accept_legacy_signatures)
            if refused is not None:
                await send_json(send, 401, {"error": f"signature refused: {refused}"})
                return
        try:
            body = loads(raw, "body") if raw.strip() else {}
        except ValidationError as exc:
            await send_json(send, 400, {"error": "body is not JSON" if exc.rule == NOT_JSON
                                        else f"body {exc.rule}"})
            return
        if not isinstance(body, dict):
            await send_json(send, 400, {"error": "body must be a JSON object"})
            return
        try:
            if action == "resolve":
                result = await client.resolve_callback(
                    callback_id, body.get("payload"), body.get("default_action", "ignore"))
                await send_json(send, 200, {
                    "outcome": result.outcome, "reason": result.reason,
                    "id": result.job.id if result.job else None,
                    "state": str(result.job.state) if result.job else None})
                return
            job = await _dispatch(client, action, callback_id, body)
        except CallbackNotFound as exc:
            await send_json(send, 404, {"error": str(exc)})
            return
        except (ValidationError, SerializationError, TypeError, ValueError) as exc:
            await send_json(send, 400, {"error": str(exc)})
            return
        except DatabaseError:  # never a traceback, never the driver's text
            await send_json(send, 503, {"error": "database unavailable"})
            return
        await send_json(send, 200, {"id": job.id, "state": str(job.state)})

    return app


async def _dispatch(client: AsyncClient, action: str, callback_id: str,
                    body: dict[str, Any]) -> Any:
    if action == "complete":
        return await client.complete_external(callback_id, body.get("payload"))
    if action == "resume":
        return await client.resume_external(callback_id, body.get("payload"))
    if action == "fail":
        error = body.get("error")
        if not isinstance(error, str):
            raise ValidationError("error", "a string is required")
        return await client.fail_external(callback_id, error)
    timeout = body.get("timeout_seconds", callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS)
    return await client.heartbeat_callback(callback_id, timeout)
