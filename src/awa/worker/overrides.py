"""Live queue overrides: change a queue's poll interval, claim batch size,
rate limit or deadline while workers run, without a restart.

Operators write ``awa.queue_overrides`` (``client.set_queue_override``, ``awa
queue overrides set``, the web UI); every worker serving the queue reads it
every `WATCH_INTERVAL` and applies it to its dispatcher, no restart needed.
Values are validated before anything is written; the table's CHECKs repeat
the limits.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core import validate
from awa.core.errors import ValidationError
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.worker.config import QueueConfig, RateLimit

log = logging.getLogger("awa.overrides")

#: How often a worker re-reads the overrides of its queues.
WATCH_INTERVAL = timedelta(seconds=2)
FIELDS = ("poll_interval_ms", "claim_batch_size", "rate_limit", "deadline_ms")
LIMITS = {"poll_interval_ms": (10, 3_600_000), "claim_batch_size": (1, 1000),
          "deadline_ms": (0, 7 * 24 * 3600 * 1000)}
MAX_RATE = 1_000_000.0
_COLUMNS = ("poll_interval_ms", "claim_batch_size", "rate_limit_per_s", "rate_limit_burst",
            "deadline_ms")


def _rate(value: Any) -> tuple[float, int]:
    """``rate`` or ``{"max_rate": r, "burst": b}`` or ``"r/b"`` → (rate, burst)."""
    burst: Any = None
    if isinstance(value, str):
        rate_text, _, burst_text = value.partition("/")
        try:
            rate: Any = float(rate_text)
            burst = int(burst_text) if burst_text else None
        except ValueError:
            raise ValidationError("rate_limit", "must look like RATE or RATE/BURST") from None
    elif isinstance(value, dict):
        rate, burst = value.get("max_rate"), value.get("burst")
    else:
        rate = value
    if isinstance(rate, bool) or not isinstance(rate, int | float) \
            or not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise ValidationError("rate_limit", f"max_rate must be a number in (0, {MAX_RATE:g}]")
    if burst is None:
        burst = max(1, math.ceil(rate))
    validate.check_int("rate_limit.burst", burst, 1, 1_000_000)
    return float(rate), int(burst)


def check_overrides(**values: Any) -> dict[str, Any]:
    """The given (non-None) override values, checked; `ValidationError` names the field."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValidationError(sorted(unknown)[0], f"is not an override (use {', '.join(FIELDS)})")
    out: dict[str, Any] = {}
    for field, value in values.items():
        if value is None:
            continue
        if field == "rate_limit":
            out[field] = _rate(value)
        else:
            low, high = LIMITS[field]
            out[field] = validate.check_int(field, value, low, high)
    if not out:
        raise ValidationError("override", f"give at least one of {', '.join(FIELDS)}")
    return out


def describe(row: Any) -> dict[str, Any]:
    """An override row as a plain dict (None = not overridden)."""
    rate = None if row["rate_limit_per_s"] is None else {
        "max_rate": row["rate_limit_per_s"], "burst": row["rate_limit_burst"]}
    return {"queue": row["queue"], "poll_interval_ms": row["poll_interval_ms"],
            "claim_batch_size": row["claim_batch_size"], "rate_limit": rate,
            "deadline_ms": row["deadline_ms"], "updated_at": row["updated_at"].isoformat(),
            "updated_by": row["updated_by"]}


def effective(base: QueueConfig, base_poll: float,
              row: Any | None) -> tuple[QueueConfig, float]:
    """The queue config and poll interval (s) a dispatcher runs with under ``row``."""
    if row is None:
        return base, base_poll
    cfg = base
    if row["claim_batch_size"] is not None:
        cfg = dataclasses.replace(cfg, claim_batch_size=row["claim_batch_size"])
    if row["rate_limit_per_s"] is not None:
        cfg = dataclasses.replace(cfg, rate_limit=RateLimit(row["rate_limit_per_s"],
                                                            row["rate_limit_burst"]))
    if row["deadline_ms"] is not None:
        cfg = dataclasses.replace(cfg, deadline=timedelta(milliseconds=row["deadline_ms"]))
    poll = base_poll if row["poll_interval_ms"] is None else row["poll_interval_ms"] / 1000
    return cfg, poll


class OverrideWatcher(PeriodicService):
    """Reads the overrides of this process's queues and applies changes."""

    name = "overrides"
    waits_for_partitions = False
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, queues: list[str],
                 apply: Callable[[str, Any | None], None]) -> None:
        super().__init__(pool, q, WATCH_INTERVAL)
        self._queues = queues
        self._apply = apply
        self._seen: dict[str, tuple[Any, ...] | None] = {}

    async def run_once(self) -> None:
        rows = {r["queue"]: r for r in await self._pool.fetch(self._q["override_list"],
                                                               self._queues)}
        for queue in self._queues:
            row = rows.get(queue)
            key = None if row is None else tuple(row[f] for f in _COLUMNS)
            if queue in self._seen and self._seen[queue] == key:
                continue
            if row is not None or queue in self._seen:
                log.info("queue %r: applying overrides %s", queue,
                         describe(row) if row is not None else "(none)")
            self._apply(queue, row)
            self._seen[queue] = key
