"""External callbacks, resolved from outside the handler (docs/guide/callbacks.md).

A handler registers a callback (a UUID stored on its running attempt) and
either returns `WaitForCallback` (the job parks, its slot is freed) or awaits
``job.wait_for_callback`` (the handler stays alive). Another system then
completes, fails, retries or resumes it by id, or heartbeats it to push the
timeout out. Each resolution is one statement that clears the id, so it
happens exactly once; the loser of a race gets `CallbackNotFound`.

Every surface resolves through `_resolve`, here: the client's methods (and
through them the HTTP ingress, `awa.web.callbacks`) on Awa's pool, and
``awa.bridge``'s ``*_in`` functions on the caller's own connection
(`awa.db.statements`). Each runs the registered follow-ups of the outcome in
its transaction and the lifecycle hooks after it, with a `Resolver`'s
retentions: the client's, or for the bridge those of the newest client of
the schema in this process (`at_hand`), the defaults when there is none.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import asyncpg

from awa.core import callback_rules, serialize, states, validate
from awa.core.errors import CallbackNotFound
from awa.core.model import Job, ResolveResult
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.db.statements import AsyncpgStatements, Statements
from awa.enqueue.bridge import CallerStatements, CallerStatementsSync, job_dict
from awa.worker.followups import FollowUpRegistry, OutcomeContext, Trigger, insert_followups_on

Executor = Conn | asyncpg.Pool
Action = Literal["complete", "fail", "retry", "resume", "heartbeat"]
T = TypeVar("T")

#: Each action's statement (``db/sql/callback.sql``) and the follow-up trigger it fires.
_ACTIONS: dict[Action, tuple[str, Trigger | None]] = {
    "complete": ("callback_complete", "completed"),
    "fail": ("callback_fail", "exhausted"),
    "retry": ("callback_retry", "retried"),
    "resume": ("callback_resume", None),
    "heartbeat": ("callback_heartbeat", None),
}


@dataclass(frozen=True, slots=True)
class Resolver:
    """Whose follow-ups, hooks and retentions a resolution uses."""

    followups: FollowUpRegistry | None = None
    completed_retention: timedelta = states.COMPLETED_RETENTION
    failed_retention: timedelta = states.FAILED_RETENTION


DEFAULTS = Resolver()
#: Per schema, the live clients' resolvers, oldest first (see `at_hand`).
_clients: dict[str, list[weakref.WeakMethod[Callable[[], Resolver]]]] = {}


def at_hand(schema: str, resolver: Callable[[], Resolver]) -> None:
    """Offer a client's ``resolver`` (a bound method) to ``awa.bridge`` for ``schema``;
    held weakly, so a client that is gone offers nothing."""
    alive = [ref for ref in _clients.get(schema, []) if ref() is not None]
    _clients[schema] = [*alive, weakref.WeakMethod(resolver)]


def resolver_for(schema: str) -> Resolver:
    """The bridge's resolver: the newest live client's of ``schema``, else the defaults."""
    for ref in reversed(_clients.get(schema, [])):
        resolver = ref()
        if resolver is not None:
            return resolver()
    return DEFAULTS


def _params(action: Action, cid: Any, arg: Any, resolver: Resolver) -> tuple[Any, ...]:
    """The statement's parameters; bad input is refused here, before any write."""
    if action == "complete":
        return cid, serialize.dumps(arg, "payload"), resolver.completed_retention
    if action == "fail":  # a too long error is cut, not refused
        return cid, validate.storable_text(validate.check_text("error", arg)), \
            resolver.failed_retention
    if action == "resume":
        return cid, serialize.dumps(arg, "payload")
    if action == "heartbeat":
        return cid, validate.check_timeout(arg)
    return (cid,)


def _not_found(cid: Any) -> CallbackNotFound:
    return CallbackNotFound(f"callback {cid} not found, already resolved, or superseded")


async def _write(db: Statements, action: Action, cid: Any, params: tuple[Any, ...],
                 resolver: Resolver) -> tuple[Job, Trigger | None]:
    """The resolving statement, then the registered follow-ups of its trigger (in
    the transaction open on ``db``, if any)."""
    name, trigger = _ACTIONS[action]
    row = await db.row(name, params)
    if row is None:
        raise _not_found(cid)
    job = Job.from_row(row)
    followups = resolver.followups
    if followups is not None and trigger is not None and followups.has_specs(trigger, job.kind):
        requests = followups.build(trigger, job, OutcomeContext(trigger))
        await insert_followups_on(db, requests, trigger_id=job.id)
    return job, trigger


async def _resolve(db: Statements, action: Action, callback_id: Any, arg: Any,
                   resolver: Resolver) -> Job:
    """Resolve one callback, for every surface. Registered follow-ups commit with it
    (in a transaction of its own when ``db`` is in none); hooks run after."""
    cid = validate.parse_callback_id(callback_id)
    params = _params(action, cid, arg, resolver)  # bad input is refused before any write
    trigger = _ACTIONS[action][1]
    own = trigger is not None and resolver.followups is not None \
        and resolver.followups.has_any(trigger) and not db.in_transaction
    if own:
        await db.execute("BEGIN")
    try:
        job, fired = await _write(db, action, cid, params, resolver)
    except BaseException:
        if own:
            await db.execute("ROLLBACK")
        raise
    if own:
        await db.execute("COMMIT")
    if resolver.followups is not None and fired is not None:
        resolver.followups.emit(fired, job)
    return job


@asynccontextmanager
async def _statements(db: Executor, q: Queries) -> AsyncIterator[Statements]:
    """Awa's connection (from the pool, or the one given), driver errors translated."""
    with translated():
        if isinstance(db, asyncpg.Pool):
            async with db.acquire() as conn:
                yield AsyncpgStatements(conn, q)
        else:
            yield AsyncpgStatements(db, q)


async def resolve(db: Executor, q: Queries, action: Action, callback_id: Any,
                  arg: Any = None, resolver: Resolver = DEFAULTS) -> Job:
    """Resolve ``callback_id`` with ``action`` on Awa's pool (the client's methods)."""
    async with _statements(db, q) as st:
        return await _resolve(st, action, callback_id, arg, resolver)


async def resolve_callback(db: Executor, q: Queries, callback_id: Any, payload: Any = None,
                           default_action: str = "ignore", *,
                           resolver: Resolver = DEFAULTS) -> ResolveResult:
    """Resolve by the callback's CEL rules (see `awa.callback_rules`); the job's
    row lock serializes concurrent resolutions, so exactly one decides."""
    cid = validate.parse_callback_id(callback_id)
    action = callback_rules.check_default_action(default_action)
    serialize.dumps(payload, "payload")  # a payload we could not store is refused up front
    async with _statements(db, q) as st:
        await st.execute("BEGIN")
        try:
            row = await st.row("callback_rules_lock", (cid,))
            if row is None:
                raise _not_found(cid)
            decision = callback_rules.decide(row["rules"], payload, action)
            if decision.outcome == "ignored":
                await st.execute("ROLLBACK")
                return ResolveResult("ignored", None, payload, decision.reason)
            await st.row("callback_rules_delete", (cid,))
            verb: Action = "complete" if decision.outcome == "completed" else "fail"
            arg = decision.payload if verb == "complete" else decision.error or "callback failed"
            job, fired = await _write(st, verb, cid, _params(verb, cid, arg, resolver),
                                      resolver)
        except BaseException:
            await st.execute("ROLLBACK")
            raise
        await st.execute("COMMIT")
    if resolver.followups is not None and fired is not None:
        resolver.followups.emit(fired, job)
    return ResolveResult(decision.outcome, job, decision.payload, decision.reason)


# -- awa.bridge: on the caller's connection, in its transaction ----------------------


async def _resolve_in(conn: Any, action: Action, callback_id: Any, arg: Any,
                      schema: str) -> dict[str, Any]:
    db = await CallerStatements.of(conn, schema)
    job = await _resolve(db, action, callback_id, arg, resolver_for(schema))
    return job_dict(job)


class _SyncStatements:
    """`Statements` over a sync connection: coroutines that never suspend."""

    def __init__(self, db: CallerStatementsSync) -> None:
        self._db = db

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    async def row(self, name: str, params: Sequence[Any]) -> Any:
        return self._db.row(name, params)

    async def execute(self, sql: str) -> None:
        self._db.execute(sql)


def _run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine whose awaits all finish at once (sync statements) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a sync callback resolution waited on something")


def _resolve_in_sync(conn: Any, action: Action, callback_id: Any, arg: Any,
                     schema: str) -> dict[str, Any]:
    db = _SyncStatements(CallerStatementsSync(conn, schema))
    return job_dict(_run_now(_resolve(db, action, callback_id, arg, resolver_for(schema))))


async def complete_external_in(conn: Any, callback_id: str, payload: Any = None, *,
                               schema: str = "awa") -> dict[str, Any]:
    """Complete a waiting job in the caller's transaction."""
    return await _resolve_in(conn, "complete", callback_id, payload, schema)


async def fail_external_in(conn: Any, callback_id: str, error: str, *,
                           schema: str = "awa") -> dict[str, Any]:
    """Fail a waiting job in the caller's transaction."""
    return await _resolve_in(conn, "fail", callback_id, error, schema)


async def retry_external_in(conn: Any, callback_id: str, *,
                            schema: str = "awa") -> dict[str, Any]:
    """Send a waiting job back to available in the caller's transaction."""
    return await _resolve_in(conn, "retry", callback_id, None, schema)


async def resume_external_in(conn: Any, callback_id: str, payload: Any = None, *,
                             schema: str = "awa") -> dict[str, Any]:
    """Resume a waiting handler in the caller's transaction; it carries on from its wait."""
    return await _resolve_in(conn, "resume", callback_id, payload, schema)


async def heartbeat_callback_in(conn: Any, callback_id: str,
                                timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS,
                                *, schema: str = "awa") -> dict[str, Any]:
    """Push a waiting callback's timeout out, in the caller's transaction."""
    return await _resolve_in(conn, "heartbeat", callback_id, timeout_seconds, schema)


def complete_external_in_sync(conn: Any, callback_id: str, payload: Any = None, *,
                              schema: str = "awa") -> dict[str, Any]:
    """Sync `complete_external_in`."""
    return _resolve_in_sync(conn, "complete", callback_id, payload, schema)


def fail_external_in_sync(conn: Any, callback_id: str, error: str, *,
                          schema: str = "awa") -> dict[str, Any]:
    """Sync `fail_external_in`."""
    return _resolve_in_sync(conn, "fail", callback_id, error, schema)


def retry_external_in_sync(conn: Any, callback_id: str, *, schema: str = "awa") -> dict[str, Any]:
    """Sync `retry_external_in`."""
    return _resolve_in_sync(conn, "retry", callback_id, None, schema)


def resume_external_in_sync(conn: Any, callback_id: str, payload: Any = None, *,
                            schema: str = "awa") -> dict[str, Any]:
    """Sync `resume_external_in`."""
    return _resolve_in_sync(conn, "resume", callback_id, payload, schema)


def heartbeat_callback_in_sync(conn: Any, callback_id: str,
                               timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS,
                               *, schema: str = "awa") -> dict[str, Any]:
    """Sync `heartbeat_callback_in`."""
    return _resolve_in_sync(conn, "heartbeat", callback_id, timeout_seconds, schema)
