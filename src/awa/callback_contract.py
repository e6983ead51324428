"""Signed callback URLs for HTTP ingress (spec §3.8).

The signature of a callback id is keyed BLAKE3 (a 32-byte secret) over the
id, hex-encoded, sent in the ``X-Awa-Signature`` header.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote

import blake3

from awa.errors import ValidationError

SIGNATURE_HEADER = "X-Awa-Signature"
#: Where `awa.web.callback_app` serves callbacks with its default ``prefix="/api"``.
DEFAULT_PATH_PREFIX = "/api/callbacks"
#: The timeout a ``heartbeat`` without ``timeout_seconds`` extends a callback by.
DEFAULT_HEARTBEAT_TIMEOUT_SECS = 3600.0
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
