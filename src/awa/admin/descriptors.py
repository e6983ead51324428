"""Descriptors, the reading side: declare them on a client, list them with a status.

Each declared queue or kind reads back ``live`` (a live worker declares it),
``stale`` (none does any more) or ``drifted`` (live workers disagree); the
declaration itself and what workers record are in `awa.worker.descriptors`.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from awa.core.errors import ValidationError
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.worker.descriptors import Scope, build
from awa.worker.presence import PRESENCE_INTERVAL, STALE_AFTER_INTERVALS


def _status_of(live_instances: int, live_variants: int) -> str:
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
             "status": _status_of(r["live_instances"], r["live_variants"]),
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
