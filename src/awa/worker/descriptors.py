"""Descriptors: human facts about queues and job kinds, declared in code.

``client.queue_descriptor("email", owner="growth", docs_url=...)`` and
``client.job_kind_descriptor("send_email", ...)`` are recorded by every
worker that starts with them (one row per process). Reading them back gives
each a status: ``live`` (a live worker declares it), ``stale`` (no live
worker does any more) or ``drifted`` (live workers declare different values).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal
from urllib.parse import urlsplit

import asyncpg

from awa.core import serialize, validate
from awa.core.errors import ValidationError
from awa.db.errors import translated
from awa.db.queries import Queries

Scope = Literal["queue", "kind"]
TEXT_LIMIT = 2000


def _text(field: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > TEXT_LIMIT or "\x00" in value:
        raise ValidationError(field, f"must be a string of at most {TEXT_LIMIT} characters")
    return value


def _is_web_url(url: str) -> bool:
    """Only http(s) links are rendered: ``javascript:`` and friends never are."""
    parts = urlsplit(url.strip())
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)


def build(scope: Scope, name: str, *, display_name: str | None = None,
          description: str | None = None, owner: str | None = None,
          docs_url: str | None = None, tags: list[str] | None = None,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A validated descriptor (raises `ValidationError` naming the bad field)."""
    field = "queue" if scope == "queue" else "kind"
    out: dict[str, Any] = {field: validate.check_name(field, name)}
    for key, value in (("display_name", display_name), ("description", description),
                       ("owner", owner), ("docs_url", docs_url)):
        out[key] = _text(key, value)
    if out["docs_url"] is not None and not _is_web_url(out["docs_url"]):
        raise ValidationError("docs_url", "must be an http:// or https:// URL")
    if tags is not None and (not isinstance(tags, list | tuple)
                             or not all(isinstance(t, str) for t in tags)):
        raise ValidationError("tags", "must be a list of strings")
    out["tags"] = list(tags or [])
    if extra is not None and not isinstance(extra, dict):
        raise ValidationError("extra", "must be a dict")
    serialize.dumps(extra or {}, "extra")
    out["extra"] = dict(extra or {})
    return out


def fingerprint(descriptor: dict[str, Any]) -> str:
    """Equal declarations have equal fingerprints (drift detection)."""
    return hashlib.sha256(serialize.canonical_json(descriptor).encode()).hexdigest()[:16]


async def sync(pool: asyncpg.Pool, q: Queries, instance_id: str,
               declared: dict[tuple[Scope, str], dict[str, Any]]) -> None:
    """Record this process's declarations (at worker start)."""
    if not declared:
        return
    keys = list(declared)
    with translated():
        await pool.execute(q["descriptor_upsert"], instance_id, [s for s, _ in keys],
                           [n for _, n in keys], [json.dumps(declared[k]) for k in keys],
                           [fingerprint(declared[k]) for k in keys])
