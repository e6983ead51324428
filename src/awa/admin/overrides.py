"""Live queue overrides, the operator's side: set, show and clear them.

What the values mean, their limits, and how workers apply them within
seconds are in `awa.worker.overrides`.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from awa.core import validate
from awa.core.errors import ValidationError
from awa.db.errors import translated
from awa.db.queries import Queries
from awa.worker.overrides import FIELDS, check_overrides, describe


class OverrideOps:
    """Mixed into `AsyncClient`: set, show and clear live queue overrides."""

    _q: Queries

    async def pool(self) -> asyncpg.Pool:
        raise NotImplementedError

    async def set_queue_override(self, queue: str, *, poll_interval_ms: int | None = None,
                                 claim_batch_size: int | None = None,
                                 rate_limit: Any = None, deadline_ms: int | None = None,
                                 updated_by: str | None = None) -> dict[str, Any]:
        """Override some of a queue's settings (others keep their value); workers
        apply it within seconds. ``rate_limit``: rate, ``"rate/burst"`` or a dict."""
        queue = validate.check_name("queue", queue)
        v = check_overrides(poll_interval_ms=poll_interval_ms, claim_batch_size=claim_batch_size,
                     rate_limit=rate_limit, deadline_ms=deadline_ms)
        rate, burst = v.get("rate_limit", (None, None))
        with translated():
            row = await (await self.pool()).fetchrow(
                self._q["override_set"], queue, v.get("poll_interval_ms"),
                v.get("claim_batch_size"), rate, burst, v.get("deadline_ms"), updated_by)
        return describe(row)

    async def queue_overrides(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Current overrides, of one queue or all."""
        names = [validate.check_name("queue", queue)] if queue is not None else None
        with translated():
            rows = await (await self.pool()).fetch(self._q["override_list"], names)
        return [describe(r) for r in rows]

    async def clear_queue_override(self, queue: str,
                                   fields: list[str] | None = None) -> bool:
        """Drop a queue's overrides (all, or the named ``fields``); False if it had none."""
        queue = validate.check_name("queue", queue)
        names = list(FIELDS) if not fields else list(fields)
        for name in names:
            if name not in FIELDS:
                raise ValidationError("fields", f"{name!r} is not one of {', '.join(FIELDS)}")
        pool = await self.pool()
        with translated():
            async with pool.acquire() as conn, conn.transaction():
                found = await conn.fetchval(self._q["override_clear_fields"], queue, names)
                await conn.execute(self._q["override_drop_empty"], queue)
        return found is not None
