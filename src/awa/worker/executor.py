"""Executor: run one claimed job and turn what happened into an `Outcome`.

Third stop of the pipeline (dispatcher → executor → completion). It rebuilds
the typed args, runs the handler (``async def`` on the loop, plain ``def`` in
the thread pool) and maps its return value or exception to an outcome
(`outcome_of`: the return types are in `awa.core.model`). It writes nothing:
`awa.worker.completion` records the outcome under the run lease.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import os
import socket
import traceback
from concurrent.futures import Executor, Future
from typing import Any

from awa.core import serialize, states, validate
from awa.core.errors import SerializationError, TerminalError
from awa.core.model import (
    Cancel,
    Job,
    Outcome,
    OutcomeKind,
    Output,
    RetryAfter,
    Snooze,
    WaitForCallback,
)
from awa.db.pool import UndecodableJson
from awa.telemetry import otel as telemetry
from awa.worker import owned
from awa.worker.context import AttemptControl, AttemptDb, JobContext
from awa.worker.tasks import Registry

TRACEBACK_FRAMES = 5
#: What a handler raises that is not its attempt's failure: the runtime
#: cancelling it (shutdown, a lost lease) or closing its coroutine. Anything
#: else, `SystemExit` (``sys.exit()``, ``exit()``) and `KeyboardInterrupt`
#: included, fails the attempt instead of ending the worker process (raised in
#: the handler's thread or task, it would stop the event loop with the job left
#: running, one worker process lost per attempt).
_PASS_THROUGH = (asyncio.CancelledError, GeneratorExit)


def describe_error(exc: BaseException) -> str:
    """Exception type, message and a short traceback, for the job's errors list.

    Always storable (`validate.storable_text`): a message with NUL characters or
    lone surrogates (binary data, a non-UTF-8 file name) is escaped, and a long
    one is cut so the whole stays within `states.ERROR_TEXT_MAX`, traceback kept.
    """
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the attempt's outcome
        message = "<message not printable>"
    head = f"{type(exc).__name__}: {message}"
    frames = traceback.extract_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]
    if not frames:
        return validate.storable_text(head)
    tail = validate.storable_text("\n" + "".join(traceback.format_list(frames)).rstrip(),
                                  states.ERROR_TEXT_MAX // 2)
    return validate.storable_text(head, states.ERROR_TEXT_MAX - len(tail)) + tail


def _seconds(field: str, value: Any) -> float:
    # Bounded, so the outcome's write cannot overflow a timestamp and leave the job running.
    return validate.check_seconds(field, value)


def outcome_of(result: Any, job: Job) -> Outcome:
    """Map a handler's return value to an outcome."""
    if result is None:  # by far the most common
        return Outcome("completed")
    if isinstance(result, RetryAfter):
        if job.attempt >= job.max_attempts:
            return Outcome("fail", error="RetryAfter: attempts exhausted")
        return Outcome("retry", delay=_seconds("RetryAfter.seconds", result.seconds))
    if isinstance(result, Snooze):
        return Outcome("snooze", delay=_seconds("Snooze.seconds", result.seconds))
    if isinstance(result, Cancel):
        return Outcome("cancel", error=validate.storable_text(f"cancelled: {result.reason}"))
    if isinstance(result, WaitForCallback):
        return Outcome("wait", token=result.token.id)
    if isinstance(result, Output):
        text = serialize.dumps(result.value, "output")
        if len(text.encode()) > states.OUTPUT_MAX_BYTES:
            return Outcome("fail", error="Output: larger than 64 KiB")
        return Outcome("completed", output_json=text)
    return Outcome("completed")


def _outcome_of_error(exc: BaseException, job: Job) -> Outcome:
    """Map a handler's exception to an outcome."""
    if isinstance(exc, TerminalError):
        return Outcome("fail", error=describe_error(exc), terminal=True)
    if job.attempt >= job.max_attempts:
        return Outcome("fail", error=describe_error(exc))
    return Outcome("retry", error=describe_error(exc))


class JobExecutor:
    """Runs handlers for claimed jobs; one per worker process."""

    def __init__(self, registry: Registry, threads: Executor, db: AttemptDb | None) -> None:
        self._registry = registry
        self._threads = threads
        self._db = db
        #: Plain ``def`` handlers submitted to the thread pool and not finished.
        self._in_threads: set[Future[Any]] = set()

    def in_threads(self) -> int:
        """Plain ``def`` handlers still running (or queued) in the thread pool: a
        thread cannot be stopped, so after shutdown they may still be running."""
        return sum(1 for f in list(self._in_threads) if not f.done())

    def use_control_pool(self, pool: Any) -> None:
        """Contexts write progress and callbacks through ``pool`` from now on."""
        if self._db is not None:
            self._db = dataclasses.replace(self._db, control=pool)

    def prepare(self, job: Job) -> tuple[JobContext | None, Outcome | None]:
        """The handler context, or the outcome that makes running impossible."""
        spec = self._registry.get(job.kind)
        if spec is None:
            # A rolling deploy: a newer worker may know this kind. Retry with
            # backoff (the attempt counts) instead of failing it for good here.
            error = (f"UnknownJobKind: no handler for {job.kind!r} on worker "
                     f"{socket.gethostname()}:{os.getpid()}")
            kind: OutcomeKind = "retry" if job.attempt < job.max_attempts else "fail"
            return None, Outcome(kind, error=error)
        if isinstance(job.args, UndecodableJson):
            return None, Outcome("fail", error="SerializationError: stored args are nested "
                                 "too deeply to decode", terminal=True)
        try:
            args = spec.build_args(job.args)
        except Exception as exc:
            err = SerializationError(f"args of {job.kind!r} do not decode: {exc}")
            return None, Outcome("fail", error=describe_error(err), terminal=True)
        return JobContext(job, args, self._db, self._registry.queue_for), None

    async def run(self, job: Job, ctx: JobContext) -> Outcome:
        """Run the handler of ``job`` and return its outcome (never raises).

        A plain ``def`` handler runs in the thread pool inside a copy of the
        caller's context (as `asyncio.to_thread` does), so the trace context
        and other context variables reach it like they reach ``async`` ones.
        """
        spec = self._registry.get(job.kind)
        assert spec is not None
        run = telemetry.job_run(job)
        if run is telemetry.NO_RUN and spec.is_async and spec.completion == "runtime":
            # The common case, without the no-op run scope's calls (same outcomes).
            try:
                return outcome_of(await spec.handler(ctx), job)
            except _PASS_THROUGH:
                raise
            except BaseException as exc:  # SystemExit, KeyboardInterrupt too: see _PASS_THROUGH
                return _outcome_of_error(exc, job)
            finally:
                AttemptControl(ctx).seal()
        with run:
            try:
                if spec.completion == "caller":  # see awa.owned
                    db = AttemptControl(ctx).db
                    assert db is not None
                    outcome = await owned.run(spec.handler, ctx, job, outcome_of,
                                              db.completed_retention)
                elif spec.is_async:
                    outcome = outcome_of(await spec.handler(ctx), job)
                else:
                    call = functools.partial(contextvars.copy_context().run, spec.handler, ctx)
                    # As run_in_executor, keeping the thread's future: `in_threads`.
                    running = self._threads.submit(call)
                    self._in_threads.add(running)
                    running.add_done_callback(self._in_threads.discard)
                    outcome = outcome_of(await asyncio.wrap_future(running), job)
            except _PASS_THROUGH:
                raise
            except BaseException as exc:
                run.error(exc)
                outcome = _outcome_of_error(exc, job)
            finally:
                AttemptControl(ctx).seal()
            run.done(outcome)
            return outcome
