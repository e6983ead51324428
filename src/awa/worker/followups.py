"""Follow-up jobs committed atomically with an outcome, and lifecycle hooks.

Two sources of follow-ups, inserted in the transaction that records the
triggering outcome (registered specs first, then staged requests in staging
order):

- handler-staged requests: ``job.enqueue_on_completion(...)`` during
  the attempt; inserted only if the handler's own completion commits;
- registered specs: ``client.on_completed_enqueue(TriggerType, fn)`` and the
  other ``on_<outcome>_enqueue``; ``fn(args, job[, context])`` returns
  follow-up args, an `EnqueueRequest`, or None to skip.

A unique follow-up is inserted under a savepoint and skipped if its key is
taken; any other insert error rolls the whole outcome back. Lifecycle hooks
(`on_event`) observe outcomes after they commit and can never break the runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import asyncpg

from awa.core import serialize, states, validate
from awa.core.errors import StagingError, UniqueConflict
from awa.core.model import Job
from awa.core.options import InsertOptions
from awa.core.outcomes import Trigger as Trigger  # re-exported: callbacks, hooks import it here
from awa.db.errors import translate
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.db.statements import AsyncpgStatements, Statements
from awa.enqueue import producer
from awa.enqueue.producer import PreparedJob, Router
from awa.telemetry import otel as telemetry

log = logging.getLogger("awa.followups")

TRIGGERS: tuple[Trigger, ...] = ("completed", "retried", "exhausted", "cancelled",
                                 "waiting_for_callback", "rescued")
EVENTS = ("started", *TRIGGERS)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """Follow-up args plus insert options, as a registered spec may return."""

    args: Any
    options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, args: Any, **options: Any) -> None:
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "options", options)


@dataclass(frozen=True, slots=True)
class OutcomeContext:
    """What a registered spec or hook learns about the outcome."""

    outcome: Trigger | Literal["started"]
    error: str | None = None
    payload: Any = None


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A lifecycle event delivered to `on_event` hooks after commit."""

    event: str
    job: Job
    error: str | None = None


def _to_request(value: Any, router: Router | None = None) -> PreparedJob | None:
    """Validate what a spec returned (args, `EnqueueRequest`, request dict, None)."""
    if value is None:
        return None
    if isinstance(value, EnqueueRequest):
        return producer.prepare(value.args, **value.options, router=router)
    if isinstance(value, Mapping) and "args" in value and set(value) <= (
            {"args"} | set(InsertOptions.__optional_keys__)):
        opts = {k: v for k, v in value.items() if k != "args"}
        return producer.prepare(value["args"], **opts, router=router)
    return producer.prepare(value, router=router)


class StagingBuffer:
    """One attempt's staged follow-ups: validated at staging, sealed at return."""

    def __init__(self, router: Router | None = None) -> None:
        self.router = router  #: where a request naming no queue goes (the kind's task)
        self.requests: list[PreparedJob] = []
        self.size = 0
        self.sealed = False
        self.poison: StagingError | None = None

    def stage(self, args: Any, opts: dict[str, Any]) -> None:
        """Validate and keep a request; raise (and poison the attempt) if it can't be."""
        try:
            if self.sealed:
                raise StagingError("enqueue_on_completion called after the handler returned")
            if len(self.requests) >= states.STAGED_FOLLOW_UPS_MAX:
                raise StagingError(f"at most {states.STAGED_FOLLOW_UPS_MAX} follow-ups "
                                   "may be staged per attempt")
            try:
                prepared = producer.prepare(args, **opts, router=self.router)
            except TypeError:
                raise
            except Exception as exc:
                raise StagingError(f"invalid follow-up: {exc}") from exc
            size = len(prepared.kind) + len(prepared.queue) + len(prepared.args_json) \
                + len(prepared.metadata_json) + sum(len(t) for t in prepared.tags) \
                + len(prepared.ordering_key or "")
            if self.size + size > states.STAGED_FOLLOW_UPS_MAX_BYTES:
                raise StagingError(f"staged follow-ups exceed "
                                   f"{states.STAGED_FOLLOW_UPS_MAX_BYTES} bytes per attempt")
        except StagingError as exc:
            if self.poison is None:
                self.poison = exc
            raise
        self.requests.append(prepared)
        self.size += size

    def seal(self) -> list[PreparedJob]:
        self.sealed = True
        return list(self.requests)


def trigger_kind(trigger_type: Any) -> str:
    """The kind a follow-up spec or hook names: a kind string or an args class."""
    if isinstance(trigger_type, str):
        return validate.check_name("kind", trigger_type)
    return serialize.derive_kind(trigger_type.__name__)


class FollowUpRegistry:
    """Registered follow-up specs and lifecycle hooks of one client."""

    def __init__(self, router: Router | None = None) -> None:
        self._router = router
        self._specs: dict[tuple[Trigger, str], list[tuple[Callable[..., Any], int, Any]]] = {}
        self._hooks: list[tuple[str | None, frozenset[str], Callable[[JobEvent], Any]]] = []

    def add_spec(self, trigger: Trigger, trigger_type: Any, fn: Callable[..., Any]) -> None:
        """Register ``fn`` for ``trigger`` outcomes of jobs of ``trigger_type`` (or a kind)."""
        if not callable(fn):
            raise TypeError("a follow-up spec must be callable")
        kind = trigger_kind(trigger_type)
        args_type = None if isinstance(trigger_type, str) else trigger_type
        self._specs.setdefault((trigger, kind), []).append((fn, _arity(fn), args_type))

    def has_specs(self, trigger: Trigger, kind: str) -> bool:
        return (trigger, kind) in self._specs

    def build(self, trigger: Trigger, job: Job,
              context: OutcomeContext) -> list[PreparedJob]:
        """Run the specs for ``trigger`` on ``job``; a raising spec is logged and skipped."""
        out = []
        for fn, arity, args_type in self._specs.get((trigger, job.kind), ()):
            try:
                args = rebuild_args(args_type, job.args)
            except Exception as exc:  # its message may quote the args: never logged
                log.error("follow-up spec %s for %s job %d skipped: the job's args do not "
                          "fit %s (%s)", getattr(fn, "__name__", fn), trigger, job.id,
                          getattr(args_type, "__name__", args_type), type(exc).__name__)
                continue
            try:
                value = fn(args, job, context) if arity >= 3 else fn(args, job)
                prepared = _to_request(value, self._router)
            except Exception:
                log.exception("follow-up spec %s for %s job %d raised; skipped",
                              getattr(fn, "__name__", fn), trigger, job.id)
                continue
            if prepared is not None:
                out.append(prepared)
        return out

    @property
    def has_hooks(self) -> bool:
        return bool(self._hooks)

    def has_any(self, trigger: Trigger) -> bool:
        """Any spec registered for ``trigger``, whatever the kind."""
        return any(t == trigger for t, _ in self._specs)

    def add_hook(self, kind: str | None, events: Sequence[str] | None,
                 fn: Callable[[JobEvent], Any]) -> None:
        unknown = set(events or ()) - set(EVENTS)
        if unknown:
            raise ValueError(f"unknown events {sorted(unknown)}; expected some of {EVENTS}")
        self._hooks.append((kind, frozenset(events or EVENTS), fn))

    def emit(self, event: str, job: Job, error: str | None = None) -> None:
        """Deliver an event to matching hooks, in the background; failures are logged."""
        if not self._hooks:
            return
        matching = [fn for kind, events, fn in self._hooks
                    if event in events and (kind is None or kind == job.kind)]
        if not matching:
            return
        payload = JobEvent(event, job, error)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # a sync caller (awa.bridge's *_sync): run them here
            loop = None
        for fn in matching:
            if loop is None:
                asyncio.run(_call_hook(fn, payload))
            else:
                loop.create_task(_call_hook(fn, payload))


async def _call_hook(fn: Callable[[JobEvent], Any], event: JobEvent) -> None:
    try:
        result = fn(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("lifecycle hook %s raised on %s of job %d",
                      getattr(fn, "__name__", fn), event.event, event.job.id)


def rebuild_args(args_type: Any, data: dict[str, Any]) -> Any:
    """Args as ``args_type`` (a dataclass or pydantic model), or the dict itself."""
    return _args_builder(args_type)(data)


@functools.cache
def _args_builder(args_type: Any) -> Callable[[dict[str, Any]], Any]:
    # Chosen once per type: a worker rebuilds args for every job it runs.
    if args_type is None or args_type is dict:
        return _same
    validate = getattr(args_type, "model_validate", None)
    if validate is not None:
        return cast(Callable[[dict[str, Any]], Any], validate)
    if isinstance(args_type, type) and dataclasses.is_dataclass(args_type) \
            and not _json_native_fields(args_type):
        # Fields typed datetime, Decimal, UUID, Enum, a nested dataclass...:
        # JSON brought them back as str/dict, so pydantic converts them back.
        from pydantic import TypeAdapter

        return TypeAdapter(args_type).validate_python
    return lambda data: args_type(**data)


_NATIVE = (str, int, float, bool, type(None), object, Any)


def _json_native_fields(cls: type) -> bool:
    """Whether every field of dataclass ``cls`` comes back from JSON as its own type
    (so the plain constructor, the fast path, rebuilds it exactly)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # names the hints refer to are not importable here
        return True
    return all(_native(hints[f.name]) for f in dataclasses.fields(cls) if f.name in hints)


def _native(tp: Any) -> bool:
    if tp in _NATIVE:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return all(isinstance(a, str | int | bool | None) for a in args)
    if origin in (list, dict, typing.Union, types.UnionType, Mapping, Sequence):
        return all(_native(a) for a in args)
    return False


def _same(data: dict[str, Any]) -> dict[str, Any]:
    return data


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


async def insert_followups(conn: Conn, q: Queries, requests: Sequence[PreparedJob],
                           *, trigger_id: int) -> list[int]:
    """Insert follow-ups inside the caller's asyncpg transaction; duplicates skipped."""
    return await insert_followups_on(AsyncpgStatements(conn, q), requests,
                                     trigger_id=trigger_id)


async def insert_followups_on(db: Statements, requests: Sequence[PreparedJob],
                              *, trigger_id: int) -> list[int]:
    """Insert follow-ups inside the transaction open on ``db`` (Awa's connection or
    the caller's): a unique one under a savepoint, skipped if its key is taken."""
    inserted = []
    for req in requests:
        if req.unique_key is None:
            inserted.append(await _insert(db, req))
            continue
        await db.execute("SAVEPOINT awa_follow_up")  # inside the outcome's transaction
        try:
            inserted.append(await _insert(db, req))
        except Exception as exc:
            if not isinstance(translate(exc), UniqueConflict):
                raise
            await db.execute("ROLLBACK TO SAVEPOINT awa_follow_up")
            log.debug("follow-up %s of job %d skipped: unique key taken", req.kind, trigger_id)
        await db.execute("RELEASE SAVEPOINT awa_follow_up")
    return inserted


async def _insert(db: Statements, req: PreparedJob) -> int:
    row = await db.row("job_insert", req.insert_params())
    assert row is not None
    telemetry.inserted(req.kind, req.queue)
    return int(row["id"])


async def after_rescue(pool: asyncpg.Pool, q: Queries, followups: FollowUpRegistry,
                       rows: Sequence[Any]) -> None:
    """After a rescue commits: the ``rescued`` hooks, and registered ``rescued`` specs'
    follow-ups (best effort: one transaction per rescued job)."""
    for row in rows:
        try:
            found = await pool.fetchrow(q["job_get"], row["id"])
        except Exception:
            continue
        if found is None:
            continue
        job = Job.from_row(found)
        followups.emit("rescued", job, job.errors[-1]["error"] if job.errors else None)
        if not followups.has_specs("rescued", job.kind):
            continue
        requests = followups.build("rescued", job, OutcomeContext("rescued"))
        try:
            async with pool.acquire() as conn, conn.transaction():
                await insert_followups(conn, q, requests, trigger_id=job.id)
        except Exception:
            log.exception("rescued follow-ups of job %d not inserted", job.id)
