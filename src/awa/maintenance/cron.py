"""Cron: recurring jobs declared in code, fired by the maintenance leader.

``client.periodic(...)`` validates a schedule immediately (5 fields, or 6 with
seconds first; an IANA timezone); `start()` upserts the declared schedules
additively. The leader's `CronService` computes each schedule's due fire
times in its timezone (DST included, via croniter) and, per fire time, moves
``last_fire_at`` forward with a compare-and-set in the same transaction as
the job insert, so a fire time yields exactly one job even if two leaders
overlap. ``coalesce`` fires only the latest missed time, ``catch_up`` every
missed time (at most `CATCH_UP_LIMIT` per pass). A schedule that never fired
fires its latest fire time at once if that was at most a minute ago (awa-pg:
within the last 24 hours), then goes on from its next fire time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
from croniter import croniter

from awa.core import serialize, states, validate
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.db.queries import Queries
from awa.enqueue import producer
from awa.maintenance.base import PeriodicService
from awa.telemetry import otel as telemetry
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.cron")
#: Failures other than a bad row (the database): once with the traceback, then a line per 30 s.
_failures = FailureLog(log)
POLICIES = ("coalesce", "catch_up")
CATCH_UP_LIMIT = 100
#: A schedule that never fired fires its latest fire time if it is this recent
#: (awa-pg: 24 hours, which fires a new daily schedule at deploy time).
FIRST_FIRE_WINDOW = timedelta(minutes=1)


def _iter(expr: str, start: datetime) -> croniter:
    return croniter(expr, start, second_at_beginning=len(expr.split()) == 6)


def _validate_expr(expr: Any) -> str:
    """A 5-field expression, or 6 fields with seconds first; else `ValidationError`."""
    if not isinstance(expr, str) or len(expr.split()) not in (5, 6):
        raise ValidationError("cron_expr", "must have 5 fields, or 6 with seconds first")
    if not croniter.is_valid(expr, second_at_beginning=len(expr.split()) == 6):
        raise ValidationError("cron_expr", f"{expr!r} is not a valid cron expression")
    return expr


def _validate_timezone(name: Any) -> ZoneInfo:
    if not isinstance(name, str):
        raise ValidationError("timezone", "must be an IANA timezone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError("timezone", f"unknown IANA timezone {name!r}") from exc


def _schedule_of(row: Any) -> ZoneInfo:
    """A stored schedule's timezone, its expression checked: the row may name a
    zone this host lacks (written by a host with newer tz data, or by hand)."""
    _validate_expr(row["cron_expr"])
    return _validate_timezone(row["timezone"])


def fire_times(expr: str, tz: ZoneInfo, after: datetime, until: datetime,
               limit: int = CATCH_UP_LIMIT) -> list[datetime]:
    """Fire times in ``(after, until]``, oldest first, at most ``limit``."""
    it = _iter(expr, after.astimezone(tz))
    out: list[datetime] = []
    while len(out) < limit:
        nxt: datetime = it.get_next(datetime)
        if nxt > until:
            break
        out.append(nxt)
    return out


def _latest_fire(expr: str, tz: ZoneInfo, until: datetime) -> datetime:
    """The last fire time at or before ``until``."""
    it = _iter(expr, until.astimezone(tz) + timedelta(microseconds=1))
    result: datetime = it.get_prev(datetime)
    return result


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated schedule, as declared with ``client.periodic``."""

    name: str
    cron_expr: str
    timezone: str
    kind: str
    queue: str | None  #: None: the queue of the kind's task, resolved by `routed`
    args: dict[str, Any]
    priority: int = states.PRIORITY_DEFAULT
    max_attempts: int = states.MAX_ATTEMPTS_DEFAULT
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    missed_fire_policy: str = "coalesce"
    #: Per-key concurrency of the jobs it fires (docs/guide/concurrency-keys.md).
    concurrency_key: str | None = None
    max_in_flight: int | None = None

    @classmethod
    def declare(cls, name: str, cron_expr: str, args_type: Any, args: Any, *,
                timezone: str = "UTC", queue: str | None = None,
                priority: int = states.PRIORITY_DEFAULT,
                max_attempts: int = states.MAX_ATTEMPTS_DEFAULT,
                tags: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None,
                missed_fire_policy: str = "coalesce", concurrency_key: str | None = None,
                max_in_flight: int | None = None) -> CronSchedule:
        """Validate everything now, so a bad schedule fails at declaration."""
        validate.check_name("name", name)
        _validate_expr(cron_expr)
        _validate_timezone(timezone)
        if missed_fire_policy not in POLICIES:
            raise ValidationError("missed_fire_policy", f"must be one of {POLICIES}")
        kind = None if args_type is None or args_type is dict \
            else serialize.derive_kind(args_type.__name__)
        prepared = producer.prepare(args, kind=kind, queue=queue, priority=priority,
                                    max_attempts=max_attempts, tags=tags, metadata=metadata,
                                    concurrency_key=concurrency_key, max_in_flight=max_in_flight)
        return cls(name=name, cron_expr=cron_expr, timezone=timezone, kind=prepared.kind,
                   queue=queue, args=prepared.args, priority=priority,
                   max_attempts=max_attempts, tags=list(prepared.tags),
                   metadata=dict(metadata or {}), missed_fire_policy=missed_fire_policy,
                   concurrency_key=prepared.concurrency_key,
                   max_in_flight=prepared.concurrency_limit)

    def routed(self, router: producer.Router) -> CronSchedule:
        """This schedule with its queue decided: as declared, else the kind's task's."""
        return self if self.queue is not None else replace(self, queue=router(self.kind))

    def upsert_params(self) -> tuple[Any, ...]:
        return (self.name, self.cron_expr, self.timezone, self.kind,
                self.queue or states.DEFAULT_QUEUE,
                serialize.dumps(self.args, "args"), self.priority, self.max_attempts, self.tags,
                serialize.dumps(self.metadata, "metadata"), self.missed_fire_policy,
                self.concurrency_key, self.max_in_flight)


def _job_for(row: Any, fire_at: datetime | None) -> producer.PreparedJob:
    """The job a schedule row fires (``fire_at`` None: triggered by hand)."""
    metadata = {**row["metadata"], "cron_name": row["name"]}
    if fire_at is not None:
        metadata["cron_fire_at"] = fire_at.isoformat()
    return producer.prepare(row["args"], kind=row["kind"], queue=row["queue"],
                            priority=row["priority"], max_attempts=row["max_attempts"],
                            tags=row["tags"], metadata=metadata,
                            concurrency_key=row["concurrency_key"],
                            max_in_flight=row["concurrency_limit"])


class CronService(PeriodicService):
    """Fires due schedules; leader only."""

    name = "cron"

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool]) -> None:
        super().__init__(pool, q, interval, is_leader)
        self.fired = 0
        #: Schedules that cannot fire as stored: name -> the reason, logged once.
        self.broken: dict[str, str] = {}

    async def run_once(self) -> None:
        rows = await self._pool.fetch(self._q["cron_list"])
        for row in rows:
            if row["paused"]:
                continue
            name = row["name"]
            try:
                await self._fire(row)
            except ValidationError as exc:  # the row itself: skip it, say so once
                if self.broken.get(name) != str(exc):
                    log.warning("cron schedule %r cannot fire and is skipped until it is "
                                "fixed: %s", name, exc)
                self.broken[name] = str(exc)
                continue
            except Exception as exc:
                _failures.failed(f"cron schedule {name!r}", exc)
                continue
            _failures.ok(f"cron schedule {name!r}")
            if self.broken.pop(name, None) is not None:
                log.warning("cron schedule %r fires again", name)

    async def _fire(self, row: Any) -> None:
        tz = _schedule_of(row)
        if row["last_fire_at"] is None:
            # Never fired: a fire time missed by at most FIRST_FIRE_WINDOW is due now, so
            # a frequent schedule runs at once (as in awa-pg) and one declared just after
            # its time still gets that run; older fire times are not made up.
            latest = _latest_fire(row["cron_expr"], tz, row["db_now"])
            due = [latest] if latest > row["db_now"] - FIRST_FIRE_WINDOW else []
        else:
            due = fire_times(row["cron_expr"], tz, row["last_fire_at"], row["db_now"])
        if not due:
            return
        if row["missed_fire_policy"] == "coalesce":
            due = due[-1:]
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchrow(self._q["cron_advance"], row["name"], due[-1],
                                   row["last_fire_at"]) is None:
                return  # another leader fired these times
            for fire_at in due:
                job = _job_for(row, fire_at)
                await conn.fetchrow(self._q["job_insert"], *job.insert_params())
                telemetry.inserted(job.kind, job.queue)
        self.fired += len(due)


async def trigger_now(pool: asyncpg.Pool, q: Queries, name: str) -> Job | None:
    """Fire a schedule once, now, without touching its next regular fire."""
    row = await pool.fetchrow(q["cron_get"], name)
    if row is None:
        return None
    job = _job_for(row, None)
    inserted = Job.from_row(await pool.fetchrow(q["job_insert"], *job.insert_params()))
    telemetry.inserted(job.kind, job.queue)
    return inserted


def describe(row: Any) -> dict[str, Any]:
    """A schedule as `list_cron_jobs` reports it, with its next fire time."""
    out = {k: row[k] for k in ("name", "cron_expr", "timezone", "kind", "queue", "args",
                               "priority", "max_attempts", "tags", "metadata",
                               "missed_fire_policy", "paused", "last_fire_at", "created_at",
                               "updated_at", "concurrency_key")}
    out["max_in_flight"] = row["concurrency_limit"]
    base = max(filter(None, [row["last_fire_at"], row["db_now"]]))
    out["next_fire_at"] = None
    out["error"] = None  # why it cannot fire, for a row this host cannot read
    try:
        tz = _schedule_of(row)
        if not row["paused"]:
            out["next_fire_at"] = _iter(row["cron_expr"], base.astimezone(tz)).get_next(
                datetime)
    except Exception as exc:  # croniter's errors too: one bad row never hides the rest
        out["error"] = str(exc) or type(exc).__name__
    return out
