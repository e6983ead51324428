"""External callbacks, resolved from outside the handler (docs/guide/callbacks.md).

A handler registers a callback (a UUID stored on its running attempt) and
either returns `WaitForCallback` (the job parks, its slot is freed) or awaits
``job.wait_for_callback`` (the handler stays alive). Another system then
completes, fails, retries or resumes it by id, or heartbeats it to push the
timeout out. Each resolution is one statement that clears the id, so it
happens exactly once; the loser of a race gets `CallbackNotFound`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core import callback_rules, serialize, states, validate
from awa.core.errors import CallbackNotFound
from awa.core.model import Job, ResolveResult
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.worker.followups import FollowUpRegistry, OutcomeContext, Trigger, insert_followups

Executor = Conn | asyncpg.Pool


@asynccontextmanager
async def _connection(db: Executor) -> AsyncIterator[Conn]:
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            yield conn
    else:
        yield db


async def _resolve(db: Executor, q: Queries, name: str, callback_id: Any, *args: Any,
                   trigger: Trigger | None = None,
                   followups: FollowUpRegistry | None = None) -> Job:
    """Run one resolution; registered specs for ``trigger`` commit with it."""
    cid = validate.parse_callback_id(callback_id)
    with translated():
        async with _connection(db) as conn, conn.transaction():
            row = await conn.fetchrow(q[name], cid, *args)
            if row is None:
                raise CallbackNotFound(
                    f"callback {cid} not found, already resolved, or superseded")
            job = Job.from_row(row)
            if followups is not None and trigger is not None \
                    and followups.has_specs(trigger, job.kind):
                requests = followups.build(trigger, job, OutcomeContext(trigger))
                await insert_followups(conn, q, requests, trigger_id=job.id)
    if followups is not None and trigger is not None:
        followups.emit(trigger, job)
    return job


async def complete_external(db: Executor, q: Queries, callback_id: Any, payload: Any = None,
                            *, retention: timedelta = states.COMPLETED_RETENTION,
                            followups: FollowUpRegistry | None = None) -> Job:
    """Complete the job waiting on ``callback_id``; the payload is kept in its metadata."""
    text = serialize.dumps(payload, "payload")
    return await _resolve(db, q, "callback_complete", callback_id, text, retention,
                          trigger="completed", followups=followups)


async def fail_external(db: Executor, q: Queries, callback_id: Any, error: str,
                        *, retention: timedelta = states.FAILED_RETENTION,
                        followups: FollowUpRegistry | None = None) -> Job:
    """Fail the job waiting on ``callback_id`` with ``error``."""
    error = validate.storable_text(validate.check_text("error", error))  # cut if too long
    return await _resolve(db, q, "callback_fail", callback_id, error, retention,
                          trigger="exhausted", followups=followups)


async def retry_external(db: Executor, q: Queries, callback_id: Any,
                         *, followups: FollowUpRegistry | None = None) -> Job:
    """Send the job waiting on ``callback_id`` back to available."""
    return await _resolve(db, q, "callback_retry", callback_id, trigger="retried",
                          followups=followups)


async def resume_external(db: Executor, q: Queries, callback_id: Any,
                          payload: Any = None) -> Job:
    """Hand ``payload`` to the handler waiting on ``callback_id``; it carries on."""
    text = serialize.dumps(payload, "payload")
    return await _resolve(db, q, "callback_resume", callback_id, text)


async def resolve_callback(db: Executor, q: Queries, callback_id: Any, payload: Any = None,
                           default_action: str = "ignore", *,
                           completed_retention: timedelta = states.COMPLETED_RETENTION,
                           failed_retention: timedelta = states.FAILED_RETENTION,
                           followups: FollowUpRegistry | None = None) -> ResolveResult:
    """Resolve by the callback's CEL rules (see `awa.callback_rules`); the job's
    row lock serializes concurrent resolutions, so exactly one decides."""
    cid = validate.parse_callback_id(callback_id)
    action = callback_rules.check_default_action(default_action)
    serialize.dumps(payload, "payload")  # a payload we could not store is refused up front
    with translated():
        async with _connection(db) as conn, conn.transaction():
            row = await conn.fetchrow(q["callback_rules_lock"], cid)
            if row is None:
                raise CallbackNotFound(
                    f"callback {cid} not found, already resolved, or superseded")
            decision = callback_rules.decide(row["rules"], payload, action)
            if decision.outcome == "ignored":
                return ResolveResult("ignored", None, payload, decision.reason)
            await conn.execute(q["callback_rules_delete"], cid)
            if decision.outcome == "completed":
                job = await complete_external(conn, q, cid, decision.payload,
                                              retention=completed_retention,
                                              followups=followups)
            else:
                job = await fail_external(conn, q, cid, decision.error or "callback failed",
                                          retention=failed_retention, followups=followups)
    return ResolveResult(decision.outcome, job, decision.payload, decision.reason)


async def heartbeat_callback(db: Executor, q: Queries, callback_id: Any,
                             timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS) -> Job:
    """Push the timeout of a waiting callback to ``timeout_seconds`` from now."""
    seconds = validate.check_timeout(timeout_seconds)
    return await _resolve(db, q, "callback_heartbeat", callback_id, seconds)
