"""External callbacks: parking, resolution, sequential waits, heartbeats, timeouts, HTTP."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import psycopg
import pytest
from tests.helpers import FAST, TO_MUTABLE, wait_for_state, wait_until

import awa
from awa.core import callback_contract
from awa.telemetry.signals import Signals

S = awa.JobState


@dataclass
class Order:
    n: int




async def test_parked_job_completed_externally(client: awa.AsyncClient) -> None:
    tokens: dict[int, str] = {}

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        token = await job.register_callback(timeout_seconds=60)
        tokens[job.id] = token.id
        return awa.WaitForCallback(token)

    job = await client.insert(Order(1))
    await client.start([("default", 1)], **FAST)
    parked = await wait_for_state(client, job.id, S.WaitingExternal)
    assert parked.callback_id == tokens[job.id] and parked.callback_timeout_at is not None
    runtime = client.runtime
    assert runtime is not None

    async def slot_freed() -> bool:  # the park commits first, then the slot is handed back
        return runtime.capacity.in_use("default") == 0

    await wait_until(slot_freed, message="the parked job's slot handed back")
    done = await client.complete_external(tokens[job.id], {"paid": True})
    assert done.state is S.Completed and done.metadata["_awa_callback_result"] == {"paid": True}
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(tokens[job.id])  # consumed
    with pytest.raises(awa.CallbackNotFound):
        await client.fail_external(tokens[job.id], "late")


async def test_fail_and_retry_external(client: awa.AsyncClient) -> None:
    tokens: list[str] = []

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        if job.attempt >= 2:
            return None
        token = await job.register_callback()
        tokens.append(token.id)
        return awa.WaitForCallback(token)

    a = await client.insert(Order(1))
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, a.id, S.WaitingExternal)
    retried = await client.retry_external(tokens[0])
    assert retried.id == a.id
    assert (await wait_for_state(client, a.id, S.Completed)).attempt == 2
    b = await client.insert(Order(2))
    await wait_for_state(client, b.id, S.WaitingExternal)
    failed = await client.fail_external(tokens[1], "provider declined")
    assert failed.state is S.Failed and failed.errors[-1]["error"] == "provider declined"


async def test_unknown_ids_and_bad_timeouts(client: awa.AsyncClient,
                                            conn: asyncpg.Connection) -> None:
    unknown = str(uuid.uuid4())
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(unknown)
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(unknown)
    with pytest.raises(awa.CallbackNotFound):
        await client.retry_external(unknown)
    with pytest.raises(awa.CallbackNotFound):
        await client.heartbeat_callback(unknown)
    for malformed in ("not-a-uuid", ""):
        with pytest.raises(awa.ValidationError, match="callback_id"):
            await client.complete_external(malformed)
    job = await client.insert(Order(1))
    cid = uuid.uuid4()
    await conn.execute(TO_MUTABLE, job.id)  # setup: to awa.jobs
    await conn.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                       "callback_id = $2, callback_timeout_at = now() + interval '1 hour' "
                       "WHERE id = $1", job.id, cid)
    before = await conn.fetchval("SELECT callback_timeout_at FROM awa.jobs WHERE id = $1", job.id)
    for timeout in (-1, float("nan"), float("inf"), "10"):
        with pytest.raises(awa.ValidationError, match="timeout_seconds"):
            await client.heartbeat_callback(str(cid), timeout)  # type: ignore[arg-type]
    after = await conn.fetchval("SELECT callback_timeout_at FROM awa.jobs WHERE id = $1", job.id)
    assert before == after
    with pytest.raises(awa.SerializationError):
        await client.complete_external(str(cid), {"x": object()})
    assert (await client.get_job(job.id)).state is S.WaitingExternal


async def test_register_rejects_bad_timeout(client: awa.AsyncClient) -> None:
    errors: list[BaseException] = []

    @client.task(Order)
    async def handle(job: awa.JobContext) -> None:
        for bad in (-5, float("nan"), float("inf")):
            try:
                await job.register_callback(timeout_seconds=bad)
            except awa.ValidationError as exc:
                errors.append(exc)

    job = await client.insert(Order(1))
    await client.start([("default", 1)], **FAST)
    done = await wait_for_state(client, job.id, S.Completed)
    assert len(errors) == 3 and done.callback_id is None


async def test_sequential_waits_in_one_handler(client: awa.AsyncClient) -> None:
    seen: list[Any] = []
    leases: list[tuple[int, int]] = []
    current: dict[str, str] = {}

    @client.task(Order)
    async def handle(job: awa.JobContext) -> None:
        for _ in range(job.args.n):
            token = await job.register_callback(timeout_seconds=60)
            current["token"] = token.id
            seen.append(await job.wait_for_callback(token))
            leases.append((job.attempt, job.run_lease))

    for waits in (2, 3):
        seen.clear()
        leases.clear()
        job = await client.insert(Order(waits))
        if client.runtime is None:
            await client.start([("default", 2)], **FAST)
        for step in range(waits):
            waiting = await wait_for_state(client, job.id, S.WaitingExternal)
            assert waiting.callback_id == current["token"]
            resumed = await client.resume_external(current["token"], {"step": step})
            assert resumed.state is S.Running
            assert resumed.metadata["_awa_callback_result"] == {"step": step}
        done = await wait_for_state(client, job.id, S.Completed)
        assert seen == [{"step": s} for s in range(waits)]
        assert set(leases) == {(1, 1)} and done.attempt == 1 and done.run_lease == 1


async def test_early_resume_and_early_completion(client: awa.AsyncClient) -> None:
    go = asyncio.Event()
    results: list[Any] = []
    tokens: dict[int, str] = {}

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        token = await job.register_callback()
        tokens[job.id] = token.id
        await go.wait()  # the callback arrives before we wait / park
        if job.args.n == 1:
            results.append(await job.wait_for_callback(token))
            return None
        return awa.WaitForCallback(token)

    early_resume = await client.insert(Order(1))
    early_complete = await client.insert(Order(2))
    await client.start([("default", 2)], **FAST)
    await wait_until(lambda: _has(tokens, 2))
    await client.resume_external(tokens[early_resume.id], "early")
    await client.complete_external(tokens[early_complete.id], "done early")
    go.set()
    await wait_for_state(client, early_resume.id, S.Completed)
    assert results == ["early"]
    done = await wait_for_state(client, early_complete.id, S.Completed)
    assert done.metadata["_awa_callback_result"] == "done early"


async def _has(d: dict[int, str], n: int) -> bool:
    return len(d) >= n


async def test_superseded_token(client: awa.AsyncClient) -> None:
    outcome: dict[str, Any] = {}
    ids: dict[str, str] = {}

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        first = await job.register_callback()
        second = await job.register_callback()
        ids.update(first=first.id, second=second.id)
        try:
            await job.wait_for_callback(first)
        except awa.CallbackNotFound as exc:
            outcome["wait_first"] = exc
        return awa.WaitForCallback(second)

    job = await client.insert(Order(1))
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.WaitingExternal)
    assert isinstance(outcome["wait_first"], awa.CallbackNotFound)
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(ids["first"])
    await client.complete_external(ids["second"])


async def test_racing_resolutions_resolve_once(client: awa.AsyncClient,
                                               database_url: str,
                                               conn: asyncpg.Connection) -> None:
    other = awa.AsyncClient(database_url)
    try:
        for round_ in range(5):
            job = await client.insert(Order(round_))
            cid = uuid.uuid4()
            await conn.execute(TO_MUTABLE, job.id)  # setup: to awa.jobs
            await conn.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                               "callback_id = $2 WHERE id = $1", job.id, cid)
            results = await asyncio.gather(
                client.complete_external(str(cid), "a"), other.fail_external(str(cid), "b"),
                other.complete_external(str(cid), "c"), client.retry_external(str(cid)),
                return_exceptions=True)
            wins = [r for r in results if isinstance(r, awa.Job)]
            assert len(wins) == 1, results
            assert all(isinstance(r, awa.CallbackNotFound) for r in results if r not in wins)
    finally:
        await other.close()


async def test_callback_heartbeat_keeps_short_timeout_alive(client: awa.AsyncClient) -> None:
    tokens: list[str] = []

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        token = await job.register_callback(timeout_seconds=1)
        tokens.append(token.id)
        return awa.WaitForCallback(token)

    job = await client.insert(Order(1), max_attempts=1)
    await client.start([("default", 1)], **FAST)
    await wait_for_state(client, job.id, S.WaitingExternal)
    started = time.monotonic()
    while time.monotonic() - started < 3.0:  # three times the timeout
        beat = await client.heartbeat_callback(tokens[0], timeout_seconds=1)
        assert beat.state is S.WaitingExternal
        await asyncio.sleep(0.3)
    assert (await client.get_job(job.id)).state is S.WaitingExternal
    # Heartbeats stop: the callback times out and, with no attempts left, fails.
    failed = await wait_for_state(client, job.id, S.Failed, timeout=10)
    assert failed.errors[-1]["error"] == "callback timed out"
    with pytest.raises(awa.CallbackNotFound):
        await client.heartbeat_callback(tokens[0])


async def test_timeout_rescue_retries_and_tells_live_waiter(client: awa.AsyncClient) -> None:
    aborted: list[BaseException] = []

    @client.task(Order)
    async def handle(job: awa.JobContext) -> None:
        if job.attempt > 1:
            return None
        token = await job.register_callback(timeout_seconds=0.3)
        try:
            await job.wait_for_callback(token)
        except awa.CallbackWaitAborted as exc:
            aborted.append(exc)
            raise

    job = await client.insert(Order(1), max_attempts=3)
    await client.start([("default", 1)], **FAST)
    done = await wait_for_state(client, job.id, S.Completed, timeout=20)
    assert aborted and done.attempt == 2
    assert done.errors[0]["error"] == "callback timed out"


async def test_cancel_and_external_completion_during_wait(client: awa.AsyncClient,
                                                          signals: Signals) -> None:
    aborted: dict[int, BaseException] = {}
    late_writes: list[int] = []
    tokens: dict[int, str] = {}

    @client.task(Order)
    async def handle(job: awa.JobContext) -> object:
        token = await job.register_callback()
        tokens[job.id] = token.id
        try:
            await job.wait_for_callback(token)
        except awa.CallbackWaitAborted as exc:
            aborted[job.id] = exc
        late_writes.append(job.id)
        return awa.RetryAfter(0)  # a late write that must change nothing

    cancelled = await client.insert(Order(1))
    completed = await client.insert(Order(2))
    await client.start([("default", 2)], **FAST)
    await wait_until(lambda: _has(tokens, 2))
    for j in (cancelled, completed):
        await wait_for_state(client, j.id, S.WaitingExternal)
    await client.cancel(cancelled.id)
    await client.complete_external(tokens[completed.id], "external")
    await wait_until(lambda: _true(len(late_writes) == 2))
    assert set(aborted) == {cancelled.id, completed.id}
    for j in (cancelled, completed):
        await signals.outcome(j.id)  # the late write was tried, and found nothing to change
    assert (await client.get_job(cancelled.id)).state is S.Cancelled
    assert (await client.get_job(completed.id)).state is S.Completed


async def _true(value: bool) -> bool:
    return value


async def test_resume_latency(client: awa.AsyncClient) -> None:
    """A resumed in-handler wait is observed promptly (LISTEN/NOTIFY wake-up)."""
    current: dict[str, str] = {}
    observed: list[float] = []
    rounds = 30

    @client.task(Order)
    async def handle(job: awa.JobContext) -> None:
        for _ in range(rounds):
            token = await job.register_callback()
            current["token"] = token.id
            await job.wait_for_callback(token)
            observed.append(time.monotonic())

    job = await client.insert(Order(1))
    await client.start([("default", 1)], poll_interval_ms=1000,
                       **{k: v for k, v in FAST.items() if k != "poll_interval_ms"})
    latencies = []
    for i in range(rounds):
        waiting = await wait_for_state(client, job.id, S.WaitingExternal)
        assert waiting.callback_id == current["token"]
        await client.resume_external(current["token"], i)
        returned = time.monotonic()
        await wait_until(lambda n=i: _true(len(observed) > n), interval=0.001)
        latencies.append((observed[i] - returned) * 1000)
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[-1]
    print(f"\nresume latency over {rounds}: p50 {p50:.1f} ms, max {p99:.1f} ms")
    assert p99 < 100  # generous: polling alone would take up to 1000 ms here


async def test_http_callbacks(client: awa.AsyncClient) -> None:
    secret = b"s" * 32
    # The id-only signatures of awa-pg, accepted while providers migrate (v2 is
    # tested in tests/test_callback_signing.py).
    app = awa.web.callback_app(client, secret=secret, accept_legacy_signatures=True)
    open_app = awa.web.callback_app(client)
    cids = []
    for n in range(3):
        job = await client.insert(Order(n))
        cid = str(uuid.uuid4())
        pool = await client.pool()
        await pool.execute(TO_MUTABLE, job.id)  # setup: to awa.jobs
        await pool.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                           "callback_id = $2, heartbeat_at = NULL WHERE id = $1", job.id,
                           uuid.UUID(cid))
        cids.append((job.id, cid))
    (j0, c0), (j1, c1), (j2, c2) = cids
    sig = callback_contract.sign(secret, c0)
    assert callback_contract.verify(secret, c0, sig)
    assert not callback_contract.verify(secret, c0, "00" * 32)
    assert callback_contract.build_callback_url("https://x.example/", "api/callbacks", c0,
                                              "complete") == \
        f"https://x.example/api/callbacks/{c0}/complete"
    status, _ = await _post(app, f"/api/callbacks/{c0}/complete", b'{"payload": 1}')
    assert status == 401  # missing signature
    status, _ = await _post(app, f"/api/callbacks/{c0}/complete", b'{"payload": 1}', "ab" * 32)
    assert status == 401
    assert (await client.get_job(j0)).state is S.WaitingExternal  # nothing changed
    status, body = await _post(app, f"/api/callbacks/{c0}/complete", b'{"payload": 1}', sig)
    assert status == 200 and body["state"] == "completed"
    sig1 = callback_contract.sign(secret, c1)
    assert (await _post(app, f"/api/callbacks/{c1}/fail", b"{not json", sig1))[0] == 400
    assert (await _post(app, f"/api/callbacks/{c1}/fail", b'{"error": 5}', sig1))[0] == 400
    assert (await _post(app, f"/api/callbacks/{c1}/heartbeat", b'{"timeout_seconds": -1}',
                        sig1))[0] == 400
    assert (await _post(app, f"/api/callbacks/{c1}/heartbeat", b"{}", sig1))[0] == 200
    assert (await _post(app, f"/api/callbacks/{c1}/fail", b'{"error": "no"}', sig1))[0] == 200
    assert (await client.get_job(j1)).state is S.Failed
    unknown = str(uuid.uuid4())
    assert (await _post(open_app, f"/api/callbacks/{unknown}/complete", b"{}"))[0] == 404
    assert (await _post(open_app, f"/api/callbacks/{c2}/resume", b'{"payload": "go"}'))[0] == 200
    assert (await client.get_job(j2)).state is S.Available  # no live handler: re-dispatched
    assert (await _post(open_app, "/api/nowhere", b"{}"))[0] == 404
    assert (await _post(open_app, "/api/callbacks/not-a-uuid/complete", b"{}"))[0] == 400


async def _post(app: Any, path: str, body: bytes,
                signature: str | dict[str, str] | None = None,
                *, encoding: str = "utf-8") -> tuple[int, dict[str, Any]]:
    """POST through the ASGI app; ``signature`` is an id-only signature or v2 headers
    (their values sent in ``encoding``: HTTP carries latin-1)."""
    import json

    headers = [(b"content-type", b"application/json")]
    if isinstance(signature, str):
        headers.append((b"x-awa-signature", signature.encode()))
    elif signature is not None:
        headers.extend((k.lower().encode(), v.encode(encoding)) for k, v in signature.items())
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_bridge_resolves_in_callers_transaction(client: awa.AsyncClient,
                                                      database_url: str) -> None:
    job = await client.insert(Order(1))
    cid = uuid.uuid4()
    pool = await client.pool()
    await pool.execute(TO_MUTABLE, job.id)  # setup: to awa.jobs
    await pool.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                       "callback_id = $2 WHERE id = $1", job.id, cid)
    conn = await asyncpg.connect(database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        done = await awa.bridge.complete_external_in(conn, str(cid), {"ok": 1})
        assert done["state"] == "completed"
        await tx.rollback()
        assert (await client.get_job(job.id)).state is S.WaitingExternal
        async with conn.transaction():
            await awa.bridge.complete_external_in(conn, str(cid), {"ok": 2})
        got = await client.get_job(job.id)
        assert got.state is S.Completed and got.metadata["_awa_callback_result"] == {"ok": 2}
        with pytest.raises(awa.CallbackNotFound):
            await awa.bridge.fail_external_in(conn, str(cid), "again")
    finally:
        await conn.close()


@dataclass
class Shipped:
    order: int


async def test_bridge_runs_registered_followups_and_hooks(client: awa.AsyncClient,
                                                          database_url: str) -> None:
    """The bridge resolves by the client's path: the registered follow-up commits (or
    rolls back) with the caller's transaction, and the hook sees the outcome."""
    client.on_completed_enqueue(Order, lambda args, job: Shipped(args.n))
    client.on_exhausted_enqueue(Order, lambda args, job: Shipped(-args.n))
    client.on_retried_enqueue(Order, lambda args, job: Shipped(100 + args.n))
    events: list[tuple[str, int]] = []
    client.on_event(Order, lambda e: events.append((e.event, e.job.id)),
                    events=["completed", "exhausted", "retried"])
    pool = await client.pool()
    first, second, third = [await client.insert(Order(n)) for n in (1, 2, 3)]
    ids = {first.id: uuid.uuid4(), second.id: uuid.uuid4(), third.id: uuid.uuid4()}
    for job_id, cid in ids.items():
        await pool.execute(TO_MUTABLE, job_id)  # setup: to awa.jobs
        await pool.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                           "callback_id = $2 WHERE id = $1", job_id, cid)
    conn = await asyncpg.connect(database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await awa.bridge.complete_external_in(conn, str(ids[first.id]), {"ok": 1})
        await tx.rollback()  # the follow-up goes with the caller's transaction
        assert await client.list_jobs(kind="shipped") == []
        async with conn.transaction():
            await awa.bridge.complete_external_in(conn, str(ids[first.id]), {"ok": 2})
        await awa.bridge.fail_external_in(conn, str(ids[second.id]), "no stock")  # autocommit
    finally:
        await conn.close()
    with psycopg.connect(database_url) as sync_conn:  # the sync functions: the same path
        awa.bridge.retry_external_in_sync(sync_conn, str(ids[third.id]))
    shipped = await client.list_jobs(kind="shipped")
    assert sorted(j.args["order"] for j in shipped) == [-2, 1, 103]
    # Hooks run once the resolution is written (the bridge cannot see the caller's
    # commit, so the rolled-back one was seen too).
    wanted = {("completed", first.id), ("exhausted", second.id), ("retried", third.id)}
    await wait_until(lambda: asyncio.sleep(0, wanted <= set(events)))
    assert set(events) == wanted
