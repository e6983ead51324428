"""Follow-ups (staged by the handler, and registered specs) and lifecycle hooks, on the runtime."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, wait_for_state, wait_until

import awa
from awa.telemetry.signals import Signals

S = awa.JobState


@dataclass
class StageA:
    n: int
    mode: str = "ok"


@dataclass
class StageB:
    item: int




async def _bs(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT id, args, metadata FROM awa.jobs_all WHERE kind = 'stage_b' "
                            "ORDER BY id")
    return [dict(r) for r in rows]


async def _count_b(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE kind = 'stage_b'"))


async def test_staged_follow_ups_commit_only_with_completion(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    @client.task(StageA)
    async def handle(job: awa.JobContext) -> object:
        job.enqueue_on_completion(StageB(job.args.n * 10), metadata={"from": job.id})
        job.enqueue_on_completion({"item": job.args.n * 10 + 1}, kind="stage_b", priority=1)
        return {
            "ok": None, "retry": awa.RetryAfter(3600), "snooze": awa.Snooze(3600),
            "cancel": awa.Cancel("no"), "wait": None,
        }.get(job.args.mode) if job.args.mode != "raise" else _raise()

    jobs = {m: await client.insert(StageA(i, m), max_attempts=5)
            for i, m in enumerate(["ok", "retry", "snooze", "cancel", "raise"], start=1)}
    await client.start([("default", 5)], **FAST)
    await wait_for_state(client, jobs["ok"].id, S.Completed)
    await wait_for_state(client, jobs["retry"].id, S.Retryable)
    await wait_for_state(client, jobs["snooze"].id, S.Scheduled)
    await wait_for_state(client, jobs["cancel"].id, S.Cancelled)
    await wait_for_state(client, jobs["raise"].id, S.Retryable)
    bs = await _bs(conn)
    # Only the completed attempt's follow-ups, in staging order.
    assert [b["args"] for b in bs] == [{"item": 10}, {"item": 11}]
    assert bs[0]["metadata"] == {"from": jobs["ok"].id}


def _raise() -> None:
    raise RuntimeError("handler error")


async def test_guard_miss_discards_staged(client: awa.AsyncClient, conn: asyncpg.Connection,
                                          signals: Signals) -> None:
    release = asyncio.Event()

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(1))
        await release.wait()

    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.Running)
    await client.cancel(job.id)  # taken over before the handler completes
    release.set()
    await signals.outcome(job.id)  # the completer found the lease taken over
    assert await _count_b(conn) == 0
    assert (await client.get_job(job.id)).state is S.Cancelled


async def test_failed_stage_poisons_the_attempt(client: awa.AsyncClient,
                                                conn: asyncpg.Connection) -> None:
    exhausted: list[int] = []
    events: list[str] = []

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(1))
        try:
            job.enqueue_on_completion(StageB(2), priority=9)  # invalid
        except awa.StagingError as exc:
            assert isinstance(exc, awa.TerminalError) and exc.__cause__ is not None
        # ...and the handler swallows it and returns normally

    client.on_exhausted_enqueue(StageA, lambda args, job: exhausted.append(job.id) or None)
    client.on_event(StageA, lambda e: events.append(e.event))
    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **FAST)
    failed = await wait_for_state(client, job.id, S.Failed)
    assert failed.errors[-1]["terminal"] is True
    assert failed.errors[-1]["error"].startswith("StagingError: invalid follow-up: priority")
    assert await _count_b(conn) == 0
    assert exhausted == [job.id]
    await wait_until(lambda: _true("exhausted" in events))
    assert events[0] == "started"


async def _true(value: bool) -> bool:
    return value


async def test_limits_and_sealed(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    errors: dict[str, awa.StagingError] = {}
    spawned: list[asyncio.Task[None]] = []

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        if job.args.mode == "count":
            for i in range(awa.core.states.STAGED_FOLLOW_UPS_MAX):
                job.enqueue_on_completion(StageB(i))
            try:
                job.enqueue_on_completion(StageB(99))
            except awa.StagingError as exc:
                errors["count"] = exc
        elif job.args.mode == "size":
            try:
                for i in range(10):
                    job.enqueue_on_completion({"item": i, "pad": "x" * 10_000}, kind="stage_b")
            except awa.StagingError as exc:
                errors["size"] = exc
        elif job.args.mode == "sealed":
            async def later() -> None:
                await asyncio.sleep(0.05)
                try:
                    job.enqueue_on_completion(StageB(7))
                except awa.StagingError as exc:
                    errors["sealed"] = exc
            spawned.append(asyncio.create_task(later()))

    ids = [(await client.insert(StageA(i, m))).id
           for i, m in enumerate(["count", "size", "sealed"])]
    await client.start([("default", 3)], **FAST)
    count_job = await wait_for_state(client, ids[0], S.Failed)
    size_job = await wait_for_state(client, ids[1], S.Failed)
    await wait_for_state(client, ids[2], S.Completed)
    await asyncio.gather(*spawned)
    assert "at most 16" in str(errors["count"]) and "16" in count_job.errors[-1]["error"]
    assert "65536 bytes" in str(errors["size"]) and size_job.errors[-1]["terminal"]
    assert "after the handler returned" in str(errors["sealed"])
    assert await _count_b(conn) == 0  # poisoned attempts insert nothing


async def test_wait_for_callback_return_discards_with_warning(
        client: awa.AsyncClient, conn: asyncpg.Connection,
        caplog: pytest.LogCaptureFixture) -> None:
    @client.task(StageA)
    async def handle(job: awa.JobContext) -> object:
        job.enqueue_on_completion(StageB(1))
        return awa.WaitForCallback(await job.register_callback())

    caplog.set_level(logging.WARNING, logger="awa.runtime")
    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **FAST)
    parked = await wait_for_state(client, job.id, S.WaitingExternal)
    assert client.runtime is not None and client.runtime.finalizer.staged_discarded_on_wait == 1
    assert any("staged follow-ups" in r.message and str(job.id) in r.message
               for r in caplog.records)
    assert parked.callback_id is not None
    await client.complete_external(parked.callback_id)
    assert await _count_b(conn) == 0


async def test_staged_kept_across_in_handler_waits(client: awa.AsyncClient,
                                                   conn: asyncpg.Connection,
                                                   signals: Signals) -> None:
    tokens: dict[int, str] = {}

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(job.args.n))
        token = await job.register_callback()
        tokens[job.id] = token.id
        await job.wait_for_callback(token)
        job.enqueue_on_completion(StageB(job.args.n + 100))

    resumed = await client.insert(StageA(1))
    completed_externally = await client.insert(StageA(2))
    await client.start([("default", 2)], **FAST)
    for j in (resumed, completed_externally):
        await wait_for_state(client, j.id, S.WaitingExternal)
    await client.resume_external(tokens[resumed.id], "go")
    await client.complete_external(tokens[completed_externally.id], "done elsewhere")
    await wait_for_state(client, resumed.id, S.Completed)
    await signals.outcome(completed_externally.id)  # its handler's late completion
    assert [b["args"] for b in await _bs(conn)] == [{"item": 1}, {"item": 101}]


async def test_deduplication_across_many_triggers_and_workers(
        database_url: str, conn: asyncpg.Connection) -> None:
    clients = [awa.AsyncClient(database_url, max_connections=4) for _ in range(2)]
    for c in clients:
        @c.task(StageA)
        async def handle(job: awa.JobContext) -> None:
            # Metadata differs per trigger but does not affect the key.
            job.enqueue_on_completion(StageB(job.args.n % 3), unique_opts={},
                                      queue="unserved", metadata={"trigger": job.id})
    try:
        await clients[0].enqueue_many_copy([StageA(i) for i in range(60)])
        for c in clients:
            await c.start([("default", 8)], **FAST)

        async def done() -> bool:
            n = await conn.fetchval("SELECT count(*) FROM awa.jobs_done "
                                    "WHERE kind = 'stage_a' AND state = 'completed'")
            return bool(n == 60)
        await wait_until(done, timeout=60)
    finally:
        for c in clients:
            await c.close()
    bs = await _bs(conn)
    assert sorted(b["args"]["item"] for b in bs) == [0, 1, 2]


async def test_follow_up_colliding_with_its_trigger_is_skipped(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals) -> None:
    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageA(job.args.n), unique_opts={})  # same key as itself

    job = await client.insert(StageA(5), unique_opts={})
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.Completed)
    await signals.outcome(job.id)  # the whole flush, follow-ups included, is over
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE kind = 'stage_a'") == 1


async def test_rejected_insert_rolls_the_completion_back(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals) -> None:
    await conn.execute("""
        CREATE FUNCTION reject_b() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.kind = 'stage_b' THEN RAISE EXCEPTION 'rejected by an outside trigger'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER reject_b BEFORE INSERT ON awa.jobs FOR EACH ROW EXECUTE FUNCTION reject_b();
        CREATE TRIGGER reject_b BEFORE INSERT ON awa.ready FOR EACH ROW EXECUTE FUNCTION reject_b();
    """)

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(1))

    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **{**FAST, "heartbeat_staleness_ms": 60_000})
    assert client.runtime is not None
    await wait_until(lambda: _true(client.runtime is not None and
                                   not client.runtime._attempts and
                                   client.runtime.dispatchers["default"].claimed == 1))
    await signals.outcome(job.id)  # tried in a batch, then alone: rolled back both times
    assert (await client.get_job(job.id)).state is S.Running  # left for rescue
    assert await _count_b(conn) == 0


async def test_completion_retried_after_lost_connection_inserts_once(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    # The first follow-up insert kills its own connection mid-transaction.
    await conn.execute("""
        CREATE SEQUENCE kills;
        CREATE FUNCTION kill_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.kind = 'stage_b' AND nextval('kills') = 1 THEN
                PERFORM pg_terminate_backend(pg_backend_pid());
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER kill_once BEFORE INSERT ON awa.jobs FOR EACH ROW
            EXECUTE FUNCTION kill_once();
        CREATE TRIGGER kill_once BEFORE INSERT ON awa.ready FOR EACH ROW
            EXECUTE FUNCTION kill_once();
    """)

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(1))
        job.enqueue_on_completion(StageB(2))

    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.Completed)
    assert await conn.fetchval("SELECT last_value FROM kills") >= 2  # it did retry
    assert [b["args"]["item"] for b in await _bs(conn)] == [1, 2]


async def test_replayed_completion_inserts_nothing_twice(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    from awa.core.model import Outcome
    from awa.enqueue.producer import prepare

    job = await client.insert(StageA(1))
    pool = await client.pool()
    from awa.db.queries import queries
    claimed = await pool.fetch(queries()["attempt_claim"], "default", 1, 0.0, 60.0)
    lease, slot = claimed[0]["run_lease"], claimed[0]["receipt_slot"]  # slot: a ring attempt's
    from datetime import timedelta

    from awa.worker.completion import Completer
    completer = Completer(pool, queries(), completed_retention=timedelta(days=1),
                          failed_retention=timedelta(days=1))
    follow = [prepare(StageB(1))]
    assert await completer.write(job.id, lease, Outcome("completed"), None, follow, slot=slot)
    # The commit's acknowledgement was "lost": the same completion is replayed.
    assert not await completer.write(job.id, lease, Outcome("completed"), None, follow,
                                     slot=slot)
    assert await _count_b(conn) == 1


async def test_rescued_attempt_follow_ups_never_appear(
        client: awa.AsyncClient, database_url: str, conn: asyncpg.Connection) -> None:
    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(job.attempt))
        if job.attempt == 1:
            await asyncio.sleep(3600)  # abandoned by shutdown below

    job = await client.insert(StageA(1))
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.Running)
    await client.shutdown(timeout_ms=0)  # abandons the first attempt's handler
    second = awa.AsyncClient(database_url)

    @second.task(StageA)
    async def handle2(job: awa.JobContext) -> None:
        job.enqueue_on_completion(StageB(job.attempt))

    try:
        await second.start([("default", 1)], **FAST)
        await wait_for_state(second, job.id, S.Completed)
    finally:
        await second.close()
    assert [b["args"] for b in await _bs(conn)] == [{"item": 2}]


async def test_registered_specs(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    calls: list[tuple[str, int]] = []

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> object:
        mode = job.args.mode
        job.enqueue_on_completion(StageB(1000 + job.args.n))
        if mode == "retry" and job.attempt == 1:
            raise ValueError("once")
        if mode == "fail":
            raise awa.TerminalError("no")
        if mode == "cancel":
            return awa.Cancel("stop")
        if mode == "wait":
            return awa.WaitForCallback(await job.register_callback())
        return None

    def completed(args: StageA, job: awa.Job, ctx: awa.OutcomeContext) -> object:
        calls.append((ctx.outcome, job.id))
        if args.n == 99:
            return None  # skip
        return awa.EnqueueRequest(StageB(args.n), queue="follow", priority=1)

    client.on_completed_enqueue(StageA, completed)
    client.on_retried_enqueue(StageA, lambda a, j: {"args": {"item": -a.n}, "kind": "stage_b"})
    client.on_exhausted_enqueue(StageA, lambda a, j: awa.EnqueueRequest(StageB(-100 - a.n)))
    client.on_cancelled_enqueue(StageA, lambda a, j: awa.EnqueueRequest(StageB(-200 - a.n)))
    client.on_waiting_for_callback_enqueue(
        StageA, lambda a, j: awa.EnqueueRequest(StageB(-300 - a.n)))
    client.on_completed_enqueue("raise_kind", lambda a, j: 1 / 0)  # a broken spec: logged only

    ids = {m: (await client.insert(StageA(n, m))).id
           for n, m in ((1, "ok"), (2, "retry"), (3, "fail"), (4, "cancel"), (5, "wait"),
                        (99, "ok"))}
    await client.start([("default", 4)], **FAST)
    await wait_for_state(client, ids["ok"], S.Completed)
    await wait_for_state(client, ids["retry"], S.Retryable)
    await wait_for_state(client, ids["fail"], S.Failed)
    await wait_for_state(client, ids["cancel"], S.Cancelled)
    parked = await wait_for_state(client, ids["wait"], S.WaitingExternal)
    rows = await conn.fetch("SELECT args, queue, priority FROM awa.jobs_all "
                            "WHERE kind = 'stage_b' ORDER BY id")
    items = [r["args"]["item"] for r in rows]
    # ok: registered (1) before staged (1001); 99: staged only; retry/fail/cancel/wait specs.
    assert sorted(items) == sorted([1, 1001, 1099, -2, -103, -204, -305])
    assert items.index(1) < items.index(1001)
    first = next(r for r in rows if r["args"]["item"] == 1)
    assert (first["queue"], first["priority"]) == ("follow", 1)
    # A callback resolved through the client fires its completed spec atomically.
    assert parked.callback_id is not None
    await client.complete_external(parked.callback_id)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all "
                               "WHERE kind = 'stage_b' AND args = '{\"item\": 5}'") == 1


async def test_rescued_spec_and_hooks(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    events: list[tuple[str, int]] = []

    @client.task(StageA)
    async def handle(job: awa.JobContext) -> None:
        if job.args.mode == "hang" and job.attempt == 1:
            await asyncio.sleep(3600)

    def broken_hook(event: awa.JobEvent) -> None:
        raise RuntimeError("hooks never break the runtime")

    async def hook(event: awa.JobEvent) -> None:
        events.append((event.event, event.job.id))

    client.on_event(None, broken_hook)
    client.on_event(StageA, hook)
    client.on_rescued_enqueue(StageA, lambda a, j: awa.EnqueueRequest(StageB(-1)))
    ok = await client.insert(StageA(1))
    hang = await client.insert(StageA(2, "hang"))
    await client.start([("default", 2)], **FAST)
    await wait_for_state(client, ok.id, S.Completed)
    await wait_for_state(client, hang.id, S.Running)
    assert client.runtime is not None
    # The hung attempt's heartbeat goes stale as if its process had died.
    client.runtime._attempts.pop(hang.id)
    await wait_for_state(client, hang.id, S.Completed, timeout=20)
    await wait_until(lambda: _true(("rescued", hang.id) in events))
    assert ("started", ok.id) in events and ("completed", ok.id) in events
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE kind = 'stage_b'") == 1
