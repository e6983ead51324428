"""Signed callback URLs for HTTP ingress (`awa.web.callback_app`).

The signature of a callback id is keyed BLAKE3 (a 32-byte secret) over the
id, hex-encoded, sent in the ``X-Awa-Signature`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from urllib.parse import quote

import blake3

from awa.core.errors import ValidationError
from awa.core.states import CALLBACK_TIMEOUT_SECS

__all__ = [
    "ACTIONS", "DEFAULT_HEARTBEAT_TIMEOUT_SECS", "DEFAULT_PATH_PREFIX", "EXPIRES_HEADER",
    "MAX_SIGNATURE_TTL", "REQUEST_ACTIONS", "SIGNATURE_HEADER", "build_callback_url",
    "request_message", "sign", "sign_request", "verify", "verify_request",
]

SIGNATURE_HEADER = "X-Awa-Signature"
#: Where `awa.web.callback_app` serves callbacks with its default ``prefix="/api"``.
DEFAULT_PATH_PREFIX = "/api/callbacks"
#: The timeout a ``heartbeat`` without ``timeout_seconds`` extends a callback by.
DEFAULT_HEARTBEAT_TIMEOUT_SECS = CALLBACK_TIMEOUT_SECS
ACTIONS = ("complete", "fail", "resume", "heartbeat")


def _key(secret: bytes | str) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) != 32:
        raise ValidationError("secret", "must be exactly 32 bytes")
    return key


def sign(secret: bytes | str, callback_id: str) -> str:
    """Hex signature of ``callback_id`` under ``secret``."""
    data = str(callback_id).encode("utf-8", "surrogatepass")
    return blake3.blake3(data, key=_key(secret)).hexdigest()


def verify(secret: bytes | str, callback_id: str, signature: str | None) -> bool:
    """True if ``signature`` is the valid signature of ``callback_id`` (constant time)."""
    if not signature:
        return False
    given = signature.strip().lower().encode("utf-8", "surrogatepass")  # any header text
    return hmac.compare_digest(sign(secret, callback_id).encode(), given)


def build_callback_url(base: str, prefix: str, callback_id: str, action: str) -> str:
    """``{base}/{prefix}/{id}/{action}``; ``prefix`` is the full route prefix, by
    default `DEFAULT_PATH_PREFIX` (slashes around it are normalised)."""
    if action not in ACTIONS:
        raise ValidationError("action", f"must be one of {', '.join(ACTIONS)}")
    parts = [base.rstrip("/"), prefix.strip("/"), quote(str(callback_id), safe=""), action]
    return "/".join(p for p in parts if p)


# -- signed requests (v2) ------------------------------------------------------------
# The id-only signature above is awa-pg's contract; anyone who sees one request can
# replay it with another action or body. A v2 signature covers the whole request.

#: Header carrying the v2 signature (``v2=<hex>``) is `SIGNATURE_HEADER`; this one
#: carries its expiry, in Unix seconds.
EXPIRES_HEADER = "X-Awa-Signature-Expires"
#: The furthest ahead an expiry may lie (what ``callback_app`` accepts by default).
MAX_SIGNATURE_TTL = 24 * 3600
V2_PREFIX = "v2="
REQUEST_ACTIONS = (*ACTIONS, "resolve")


def request_message(action: str, callback_id: str, expires: int, body: bytes) -> bytes:
    """The bytes a v2 signature covers: version, action, id, expiry and SHA-256 of the body."""
    digest = hashlib.sha256(body).hexdigest()
    return f"awa-callback-v2\n{action}\n{callback_id}\n{int(expires)}\n{digest}".encode(
        "utf-8", "surrogatepass")


def sign_request(secret: bytes | str, action: str, callback_id: str, body: bytes,
                 expires: int) -> dict[str, str]:
    """The two headers that sign one callback request (v2), e.g. for an HTTP client."""
    if action not in REQUEST_ACTIONS:
        raise ValidationError("action", f"must be one of {', '.join(REQUEST_ACTIONS)}")
    if isinstance(expires, bool) or not isinstance(expires, int):
        raise ValidationError("expires", "must be Unix seconds (an int)")
    mac = blake3.blake3(request_message(action, callback_id, expires, body),
                        key=_key(secret)).hexdigest()
    return {SIGNATURE_HEADER: V2_PREFIX + mac, EXPIRES_HEADER: str(expires)}


def verify_request(secret: bytes | str, action: str, callback_id: str, body: bytes,
                   headers: Mapping[str, str], *, now: float | None = None,
                   max_ttl: float = MAX_SIGNATURE_TTL,
                   accept_legacy: bool = False) -> str | None:
    """Why the request's signature is refused, or None when it is valid (constant time).

    ``headers`` are matched case-insensitively. The id-only signature of `sign`
    is accepted only with ``accept_legacy`` (while providers migrate)."""
    lower = {k.lower(): v for k, v in headers.items()}
    given = (lower.get(SIGNATURE_HEADER.lower()) or "").strip()
    if not given:
        return "missing signature"
    if not given.lower().startswith(V2_PREFIX):
        if accept_legacy and verify(secret, callback_id, given):
            return None
        return "legacy id-only signature refused" if not accept_legacy else "bad signature"
    raw_expires = (lower.get(EXPIRES_HEADER.lower()) or "").strip()
    # ASCII digits only: str.isdigit also accepts "²" and other digits int() refuses.
    if not (raw_expires.isascii() and raw_expires.isdigit()) or len(raw_expires) > 12:
        return f"missing or malformed {EXPIRES_HEADER}"
    expires = int(raw_expires)
    current = time.time() if now is None else now
    if expires < current:
        return "signature expired"
    if expires > current + max_ttl:
        return f"expiry more than {int(max_ttl)} s ahead"
    wanted = blake3.blake3(request_message(action, callback_id, expires, body),
                           key=_key(secret)).hexdigest()
    mac = given[len(V2_PREFIX):].lower().encode("utf-8", "surrogatepass")
    return None if hmac.compare_digest(wanted.encode(), mac) else "bad signature"
