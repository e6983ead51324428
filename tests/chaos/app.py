"""The chaos workload: ``python -m awa worker tests.chaos.app:client --queue chaos=16``.

Every handler first records its run in ``chaos_runs`` (job id, attempt, run lease,
pid), so the harness can compare what ran with what the database says finished.
Before that it appends "job id, run lease" to a file of its process in
``$AWA_CHAOS_STARTS`` (a directory), outside the database: a start whose claim
the server then forgot (a crash) leaves no trace in ``chaos_runs``, but it does
there, so the harness can count the (job, lease) pairs started twice.
Kinds and their expected terminal states:

- ``work``   completes after a few ms;
- ``flaky``  returns RetryAfter on its first ``fails`` attempts, then completes; a
  registered ``on_completed_enqueue`` spec adds one ``audit`` job per completion;
- ``nap``    snoozes on its first claim, then completes;
- ``park``   registers a callback and returns WaitForCallback; the harness calls
  ``complete_external``;
- ``await_cb`` registers a callback and waits for it in the handler, still running; the
  harness calls ``resume_external``, then the handler completes;
- ``stage``  stages one ``child`` follow-up (inserted with its completion) and completes;
- ``doom``   raises TerminalError: failed;
- ``stuck``  on its first claim holds every connection of the client pool for
  ``hold_s`` seconds (a pool exhausted by a stuck handler), then completes;
- ``sleeper`` sleeps ``seconds`` in a process started with ``AWA_CHAOS_VICTIM=1``
  (the one the recovery-time test kills), else completes at once;
- ``tick``   fired by the cron schedule ``chaos_tick`` every second.

``AWA_CHAOS_SKEW_S`` shifts this process's wall clock (time.time and
datetime.now) by that many seconds; ``AWA_CHAOS_CRON=0`` declares no schedule.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import awa


def _skew_clock(seconds: float) -> None:
    """Shift time.time() and datetime.now() of this process by ``seconds``."""
    real_time, real_time_ns, real_dt = time.time, time.time_ns, datetime

    class _Meta(type):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, real_dt)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real_dt)

    class SkewedDatetime(real_dt, metaclass=_Meta):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real_dt.fromtimestamp(real_time() + seconds, tz)

        @classmethod
        def utcnow(cls) -> Any:
            return real_dt.utcfromtimestamp(real_time() + seconds)

        @classmethod
        def today(cls) -> Any:
            return cls.now()

    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]
    import datetime as dt_module

    dt_module.datetime = SkewedDatetime  # type: ignore[misc]
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "datetime", None) is real_dt:
            try:
                module.datetime = SkewedDatetime
            except (AttributeError, TypeError):
                pass


SKEW = float(os.environ.get("AWA_CHAOS_SKEW_S", "0") or 0)
if SKEW:
    _skew_clock(SKEW)

VICTIM = os.environ.get("AWA_CHAOS_VICTIM") == "1"
# A client-side statement timeout, as an application on a network that can
# silently drop connections should set: the ledger writes below use this pool.
# Five connections: in half_open_all the server keeps every frozen session (57
# of them) while three workers open replacements, and with ten each the shared
# test server's 100 slots ran out (TooManyConnectionsError, handlers retried).
client = awa.AsyncClient(os.environ.get("DATABASE_URL"), max_connections=5,
                         command_timeout=10.0)
QUEUE = "chaos"
TIMEOUT = 10.0  # seconds, for the ledger writes (a half-open connection must not hang us)


@dataclass
class Work:
    n: int


@dataclass
class Flaky:
    n: int
    fails: int = 1


@dataclass
class Nap:
    n: int


@dataclass
class Park:
    n: int


@dataclass
class AwaitCb:
    n: int


@dataclass
class Stage:
    n: int


@dataclass
class Child:
    parent: int


@dataclass
class Audit:
    parent: int


@dataclass
class Doom:
    n: int


@dataclass
class Stuck:
    n: int
    hold_s: float = 3.0


@dataclass
class Sleeper:
    n: int
    seconds: float = 600.0


@dataclass
class Tick:
    pass


STARTS = os.environ.get("AWA_CHAOS_STARTS")
_starts_fd: int | None = None


def _log_start(job: Any) -> None:
    """Append "id lease" to this process's start ledger (one small O_APPEND write: it
    survives the process being killed, and lines never interleave)."""
    global _starts_fd
    if STARTS is None:
        return
    if _starts_fd is None:
        _starts_fd = os.open(os.path.join(STARTS, f"starts-{os.getpid()}.log"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_starts_fd, f"{job.id} {job.run_lease}\n".encode())


#: ``AWA_CHAOS_ASYNC_LEDGER=1``: the chaos_runs row commits asynchronously. A
#: synchronous commit flushes all the WAL before it, the claim of the job included,
#: so each handler's own ledger write would make its claim durable within
#: milliseconds and hide a claim the server can forget (an application's handler
#: need not write to the database at all). No completion is hidden by it: the
#: completion commits after the ledger row, and its flush covers the row.
ASYNC_LEDGER = os.environ.get("AWA_CHAOS_ASYNC_LEDGER") == "1"


async def _record(job: Any) -> None:
    _log_start(job)
    pool = await client.pool()
    if ASYNC_LEDGER:
        await pool.execute("WITH a AS (SELECT set_config('synchronous_commit', 'off', true)) "
                           "INSERT INTO chaos_runs (job_id, kind, attempt, run_lease, pid) "
                           "SELECT $1, $2, $3, $4, $5 FROM a", job.id, job.kind, job.attempt,
                           job.run_lease, os.getpid(), timeout=TIMEOUT)
        return
    await pool.execute("INSERT INTO chaos_runs (job_id, kind, attempt, run_lease, pid) "
                       "VALUES ($1, $2, $3, $4, $5)", job.id, job.kind, job.attempt,
                       job.run_lease, os.getpid(), timeout=TIMEOUT)


async def _pause() -> None:
    await asyncio.sleep(random.uniform(0.0, 0.01))


@client.task(Work, queue=QUEUE)
async def work(job: Any) -> None:
    await _record(job)
    await _pause()


@client.task(Flaky, queue=QUEUE)
async def flaky(job: Any) -> Any:
    await _record(job)
    await _pause()
    if job.attempt <= job.args.fails:
        return awa.RetryAfter(0.05)
    return None


client.on_completed_enqueue(Flaky, lambda args, job: {"args": Audit(parent=job.id),
                                                      "queue": QUEUE})


@client.task(Nap, queue=QUEUE)
async def nap(job: Any) -> Any:
    await _record(job)
    if job.run_lease == 1:
        return awa.Snooze(0.05)
    return None


@client.task(Park, queue=QUEUE)
async def park(job: Any) -> Any:
    await _record(job)
    token = await job.register_callback(timeout_seconds=20)
    return awa.WaitForCallback(token)


@client.task(AwaitCb, queue=QUEUE, kind="await_cb")
async def await_cb(job: Any) -> None:
    await _record(job)
    token = await job.register_callback(timeout_seconds=20)
    await job.wait_for_callback(token)


@client.task(Stage, queue=QUEUE)
async def stage(job: Any) -> None:
    await _record(job)
    await _pause()
    job.enqueue_on_completion(Child(parent=job.id), queue=QUEUE)


@client.task(Child, queue=QUEUE)
async def child(job: Any) -> None:
    await _record(job)


@client.task(Audit, queue=QUEUE)
async def audit(job: Any) -> None:
    await _record(job)


@client.task(Doom, queue=QUEUE)
async def doom(job: Any) -> None:
    await _record(job)
    raise awa.TerminalError("doomed by design")


#: Two stuck jobs in one process take turns: each taking part of the pool and
#: waiting for the rest would deadlock them (and every handler after them) for good.
_STUCK_TURN = asyncio.Lock()


@client.task(Stuck, queue=QUEUE)
async def stuck(job: Any) -> None:
    await _record(job)
    if job.run_lease != 1:
        return
    pool = await client.pool()
    held = []
    async with _STUCK_TURN:
        try:
            for _ in range(pool.get_max_size()):
                held.append(await pool.acquire())
            await asyncio.sleep(job.args.hold_s)
        finally:
            for conn in held:
                await pool.release(conn)


@client.task(Sleeper, queue=QUEUE)
async def sleeper(job: Any) -> None:
    await _record(job)
    if VICTIM:  # only the process the test will kill holds on to them
        await asyncio.sleep(job.args.seconds)


@client.task(Tick, queue=QUEUE)
async def tick(job: Any) -> None:
    await _record(job)


if os.environ.get("AWA_CHAOS_CRON", "1") != "0":
    client.periodic("chaos_tick", "* * * * * *", Tick, Tick(), queue=QUEUE,
                    missed_fire_policy="catch_up")
