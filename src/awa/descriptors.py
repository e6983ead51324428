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

from awa import producer
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.errors import ValidationError
from awa.presence import PRESENCE_INTERVAL, STALE_AFTER_INTERVALS

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
    out: dict[str, Any] = {field: producer.check_name(field, name)}
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
    producer.dumps(extra or {}, "extra")
    out["extra"] = dict(extra or {})
    return out


def fingerprint(descriptor: dict[str, Any]) -> str:
    """Equal declarations have equal fingerprints (drift detection)."""
    return hashlib.sha256(producer.canonical_json(descriptor).encode()).hexdigest()[:16]


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


def status_of(live_instances: int, live_variants: int) -> str:
    """live, stale or drifted."""
    if live_instances == 0:
        return "stale"
    return "drifted" if live_variants > 1 else "live"


async def read(db: Conn | asyncpg.Pool, q: Queries,
               scope: Scope | None = None) -> list[dict[str, Any]]:
    """Every declared queue and kind (of ``scope``) with its status."""
    live_within = PRESENCE_INTERVAL.total_seconds() * STALE_AFTER_INTERVALS
    with translated():
        rows = await db.fetch(q["descriptor_status"], live_within, scope)
    return [{"scope": r["scope"], "name": r["name"], "descriptor": r["descriptor"],
             "status": status_of(r["live_instances"], r["live_variants"]),
             "live_instances": r["live_instances"],
             "declared_at": r["declared_at"].isoformat()} for r in rows]


class DescriptorOps:
    """Mixed into `AsyncClient`: declare descriptors, read them with their status."""

    _q: Queries
    _descriptors: dict[tuple[Scope, str], dict[str, Any]]
    _runtime: object | None

    async def pool(self) -> asyncpg.Pool:
        raise NotImplementedError

    def _before_start(self) -> None:
        if self._runtime is not None:
            raise ValidationError("descriptor", "declare descriptors before start(): the "
                                  "running worker recorded its descriptors when it started")

    def queue_descriptor(self, queue: str, *, display_name: str | None = None,
                         description: str | None = None, owner: str | None = None,
                         docs_url: str | None = None, tags: list[str] | None = None,
                         extra: dict[str, Any] | None = None) -> None:
        """Describe a queue; workers started by this client record it."""
        self._before_start()
        self._descriptors[("queue", queue)] = build(
            "queue", queue, display_name=display_name, description=description, owner=owner,
            docs_url=docs_url, tags=tags, extra=extra)

    def job_kind_descriptor(self, kind: str, *, display_name: str | None = None,
                            description: str | None = None, owner: str | None = None,
                            docs_url: str | None = None, tags: list[str] | None = None,
                            extra: dict[str, Any] | None = None) -> None:
        """Describe a job kind; workers started by this client record it."""
        self._before_start()
        self._descriptors[("kind", kind)] = build(
            "kind", kind, display_name=display_name, description=description, owner=owner,
            docs_url=docs_url, tags=tags, extra=extra)

    async def list_descriptors(self, scope: Scope | None = None) -> list[dict[str, Any]]:
        """Every declared queue and kind with its status (live, stale, drifted)."""
        if scope not in (None, "queue", "kind"):
            raise ValidationError("scope", "must be 'queue', 'kind' or None")
        return await read(await self.pool(), self._q, scope)
