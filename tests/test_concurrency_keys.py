"""Per-key concurrency: concurrency_key + max_in_flight (docs/guide/concurrency-keys.md).

The bound is checked the way an operator would: a sampler on its own
connection reads the jobs in flight per key from the table, over and over,
while workers run. The subprocess and kill/restart version is in
test_concurrency_keys_procs.py.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, wait_for_state, wait_until

import awa
from awa.db.queries import queries
from awa.telemetry.signals import Signals

S = awa.JobState


@dataclass
class Work:
    n: int
    seconds: float = 0.0
    mode: str = "ok"


class Sampler:
    """Polls ``jobs in flight per key`` on its own connection until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self._stop.is_set():
                rows = await conn.fetch("SELECT concurrency_key, count(*) FROM awa.jobs "
                                        "WHERE state = 'running' AND concurrency_key IS NOT NULL"
                                        " GROUP BY 1")
                for key, n in rows:
                    self.peak[key] = max(self.peak.get(key, 0), n)
                self.samples += 1
        finally:
            await conn.close()

    def __enter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


async def _active(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM awa.jobs_active"))


# -- the API -----------------------------------------------------------------------


@pytest.mark.parametrize(("opts", "field", "rule"), [
    ({"concurrency_key": "k", "max_in_flight": 0}, "max_in_flight", "between 1 and"),
    ({"concurrency_key": "k", "max_in_flight": -3}, "max_in_flight", "between 1 and"),
    ({"concurrency_key": "k", "max_in_flight": True}, "max_in_flight", "integer"),
    ({"concurrency_key": "k", "max_in_flight": 2.5}, "max_in_flight", "integer"),
    ({"max_in_flight": 2}, "max_in_flight", "needs a concurrency_key"),
    ({"concurrency_key": ""}, "concurrency_key", "1-200"),
    ({"concurrency_key": "x" * 201}, "concurrency_key", "1-200"),
    ({"concurrency_key": 42}, "concurrency_key", "string"),
    ({"concurrency_key": "a\x00b"}, "concurrency_key", "NUL"),
])
async def test_bad_options_are_refused_before_writing(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection,
                                                      opts: dict[str, Any], field: str,
                                                      rule: str) -> None:
    with pytest.raises(awa.ValidationError, match=rule) as err:
        await client.insert(Work(1), **opts)
    assert err.value.field == field
    with pytest.raises(awa.ValidationError, match=rule):
        await client.insert_many_copy([Work(1), Work(2)], **opts)
    assert await _active(conn) == 0


@pytest.mark.parametrize("value", [0, -1, True, "2"])
async def test_bad_queue_key_limit_is_refused(client: awa.AsyncClient, value: Any) -> None:
    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> None:
        return None

    with pytest.raises(awa.ValidationError) as err:
        await client.start(queues=[{"name": "tenants", "max_workers": 2,
                                    "key_max_in_flight": value}])
    assert err.value.field == "key_max_in_flight"


async def test_every_insert_path_stores_key_and_limit(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection) -> None:
    one = await client.insert(Work(1), concurrency_key="t-1", max_in_flight=3)
    assert (one.concurrency_key, one.concurrency_limit) == ("t-1", 3)
    default_limit = await client.insert(Work(2), concurrency_key="t-2")
    assert (default_limit.concurrency_key, default_limit.concurrency_limit) == ("t-2", None)
    many = await client.insert_many_copy(
        [Work(3), Work(4)], opts=[{"concurrency_key": "t-3", "max_in_flight": 2}, None],
        concurrency_key="t-4", max_in_flight=5)
    assert [(j.concurrency_key, j.concurrency_limit) for j in many] == [("t-3", 2), ("t-4", 5)]
    assert await client.enqueue_many_copy([Work(5)], concurrency_key="t-5",
                                          max_in_flight=1) == 1
    async with client.transaction() as tx:
        await tx.insert(Work(6), concurrency_key="t-6", max_in_flight=4)
    plain = await client.insert(Work(7))
    assert plain.concurrency_key is None and plain.concurrency_limit is None
    rows = await conn.fetch("SELECT args->>'n' AS n, concurrency_key, concurrency_limit "
                            "FROM awa.jobs_all ORDER BY id")
    assert [(r["concurrency_key"], r["concurrency_limit"]) for r in rows] == [
        ("t-1", 3), ("t-2", None), ("t-3", 2), ("t-4", 5), ("t-5", 1), ("t-6", 4),
        (None, None)]
    got = await client.get_job(one.id)
    assert got.concurrency_key == "t-1" and got.to_dict()["concurrency_key"] == "t-1"


# -- the bound ---------------------------------------------------------------------


async def test_bound_holds_with_many_keys_and_limits(client: awa.AsyncClient,
                                                     database_url: str,
                                                     conn: asyncpg.Connection) -> None:
    rng = random.Random(7)
    limits = {f"tenant-{i}": rng.randint(1, 4) for i in range(25)}
    seen: dict[str, int] = {}
    peak_in_handler: dict[str, int] = {}

    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> None:
        key = job.concurrency_key
        assert key is not None and job.concurrency_slot is not None
        assert 1 <= job.concurrency_slot <= limits[key]
        seen[key] = seen.get(key, 0) + 1
        peak_in_handler[key] = max(peak_in_handler.get(key, 0), seen[key])
        await asyncio.sleep(job.args.seconds)
        seen[key] -= 1

    keys = list(limits)
    jobs = [Work(i, rng.uniform(0.0, 0.02)) for i in range(600)]
    opts = [{"concurrency_key": (k := rng.choice(keys)), "max_in_flight": limits[k]}
            for _ in jobs]
    await client.insert_many_copy(jobs, opts=opts)
    sampler = Sampler(database_url)
    with sampler:
        await client.start(queues=[{"name": "tenants", "max_workers": 40,
                                    "key_max_in_flight": 1}], **FAST)
        await wait_until(lambda: _drained(conn), timeout=60, message="the queue to drain")
        await sampler.stop()
    assert sampler.samples > 10
    assert all(sampler.peak[k] <= limits[k] for k in sampler.peak), sampler.peak
    assert all(peak_in_handler[k] <= limits[k] for k in peak_in_handler)
    # Several keys really ran at their limit (the test exercised the bound).
    assert sum(peak_in_handler[k] == limits[k] > 1 for k in limits) >= 3
    done = await conn.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
    assert done == len(jobs)


async def _drained(conn: asyncpg.Connection) -> bool:
    return await _active(conn) == 0


async def test_concurrent_claims_never_over_grant(client: awa.AsyncClient,
                                                  database_url: str,
                                                  conn: asyncpg.Connection) -> None:
    """Many claimers race on a few keys at once; no job completes, so every grant
    stays taken: exactly `limit` per key may be running, never one more."""
    limits = {"a": 1, "b": 3, "c": 7}
    for key, limit in limits.items():
        await client.enqueue_many_copy([Work(i) for i in range(40)], concurrency_key=key,
                                       max_in_flight=limit)
    q = queries()
    races = 0

    async def claimer() -> None:
        nonlocal races
        c = await asyncpg.connect(database_url)
        try:
            for _ in range(15):
                try:
                    await c.fetch(q["attempt_claim_keyed"], "default", 4, 0.0, 0.0, "", 500)
                except asyncpg.UniqueViolationError:
                    races += 1  # the index refused a slot taken meanwhile: no over-grant
        finally:
            await c.close()

    await asyncio.gather(*(claimer() for _ in range(8)))
    rows = await conn.fetch("SELECT concurrency_key, count(*) AS n, "
                            "array_agg(concurrency_slot ORDER BY concurrency_slot) AS slots "
                            "FROM awa.jobs WHERE state = 'running' GROUP BY 1")
    running = {r["concurrency_key"]: list(r["slots"]) for r in rows}
    assert running == {k: list(range(1, n + 1)) for k, n in limits.items()}
    # The plain claim never takes a keyed job.
    assert await conn.fetch(q["attempt_claim"], "default", 50, 0.0, 0.0) == []


async def test_saturated_key_does_not_block_other_keys(client: awa.AsyncClient,
                                                       conn: asyncpg.Connection) -> None:
    release = asyncio.Event()
    done: list[str] = []

    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> None:
        if job.concurrency_key == "hot":
            await release.wait()
        done.append(job.concurrency_key or "-")

    # The hot key's jobs are the oldest: at the head of the queue.
    await client.enqueue_many_copy([Work(i) for i in range(300)], concurrency_key="hot",
                                   max_in_flight=2)
    await client.enqueue_many_copy([Work(i) for i in range(60)],
                                   opts=[{"concurrency_key": f"cold-{i % 30}"}
                                         for i in range(60)])
    await client.enqueue_many_copy([Work(i) for i in range(20)])  # unkeyed
    await client.start(queues=[{"name": "tenants", "max_workers": 10,
                                "key_max_in_flight": 1}], **FAST)
    await wait_until(lambda: _count(done, 80), timeout=30, message="the other keys to run")
    assert "hot" not in done
    hot_running = await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'running' "
                                      "AND concurrency_key = 'hot'")
    assert hot_running == 2
    release.set()
    await wait_until(lambda: _drained(conn), timeout=60, message="the hot key to drain")


async def _count(items: list[str], n: int) -> bool:
    return len(items) >= n


async def test_queue_limit_applies_to_jobs_without_their_own(client: awa.AsyncClient,
                                                             database_url: str,
                                                             conn: asyncpg.Connection) -> None:
    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> None:
        await asyncio.sleep(0.03)

    await client.enqueue_many_copy([Work(i) for i in range(60)], concurrency_key="k")
    sampler = Sampler(database_url)
    with sampler:
        await client.start(queues=[{"name": "tenants", "max_workers": 10,
                                    "key_max_in_flight": 3}], **FAST)
        await wait_until(lambda: _drained(conn), timeout=30, message="the queue to drain")
        await sampler.stop()
    assert sampler.peak["k"] == 3
    assert await conn.fetchval("SELECT key_max_in_flight FROM awa.queues "
                               "WHERE queue = 'tenants'") == 3


# -- the key survives every way back to the queue ------------------------------------


async def test_key_survives_retry_snooze_and_terminal_failure(client: awa.AsyncClient,
                                                              database_url: str,
                                                              conn: asyncpg.Connection
                                                              ) -> None:
    runs: dict[int, int] = {}

    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> object:
        runs[job.args.n] = runs.get(job.args.n, 0) + 1
        await asyncio.sleep(0.02)
        if job.args.mode == "retry" and runs[job.args.n] < 3:
            return awa.RetryAfter(0.01)
        if job.args.mode == "snooze" and runs[job.args.n] < 3:
            return awa.Snooze(0.01)
        if job.args.mode == "fail":
            raise awa.TerminalError("no")
        return None

    jobs = [Work(i, mode=("retry", "snooze", "ok")[i % 3]) for i in range(30)]
    await client.insert_many_copy(jobs, concurrency_key="one", max_in_flight=1)
    failing = await client.insert(Work(99, mode="fail"), concurrency_key="one",
                                  max_in_flight=1)
    sampler = Sampler(database_url)
    with sampler:
        await client.start(queues=[{"name": "tenants", "max_workers": 8, "dlq_enabled": True}],
                           **FAST)
        await wait_until(lambda: _drained(conn), timeout=60, message="the queue to drain")
        await sampler.stop()
    assert sampler.peak["one"] == 1
    rows = await conn.fetch("SELECT concurrency_key, concurrency_limit FROM awa.jobs_done")
    assert {(r[0], r[1]) for r in rows} == {("one", 1)} and len(rows) == 30
    # Dead-lettered with its key, and back with it (bound again) on retry.
    entry = await client.get_dlq_job(failing.id)
    assert entry is not None and entry.job.concurrency_key == "one"
    back = await client.retry_from_dlq(failing.id)
    assert back is not None and (back.concurrency_key, back.concurrency_limit) == ("one", 1)


async def test_key_survives_admin_retry_of_failed_job(client: awa.AsyncClient) -> None:
    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> None:
        raise awa.TerminalError("no")

    job = await client.insert(Work(1), concurrency_key="k", max_in_flight=2)
    await client.start(queues=[("tenants", 2)], **FAST)
    await wait_for_state(client, job.id, S.Failed)
    await client.shutdown()
    again = await client.retry(job.id)
    assert (again.concurrency_key, again.concurrency_limit) == ("k", 2)


async def test_rescued_job_keeps_key_and_frees_its_slot(client: awa.AsyncClient,
                                                        conn: asyncpg.Connection) -> None:
    from datetime import timedelta
    first = await client.insert(Work(1), concurrency_key="k", max_in_flight=1)
    second = await client.insert(Work(2), concurrency_key="k", max_in_flight=1)
    pool = await client.pool()
    q = queries()
    claimed = await pool.fetch(q["attempt_claim_keyed"], "default", 5, 0.0, 0.0, "", 500)
    assert [r["id"] for r in claimed] == [first.id] and claimed[0]["concurrency_slot"] == 1
    # Saturated: nothing more for this key.
    again = await pool.fetch(q["attempt_claim_keyed"], "default", 5, 0.0, 0.0, "", 500)
    assert again[0]["id"] is None
    await conn.execute("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' "
                       "WHERE id = $1", first.id)
    rescued = await pool.fetch(q["job_rescue_running"], timedelta(seconds=90), 100,
                               timedelta(days=1), None, [])
    assert [r["id"] for r in rescued] == [first.id]
    job = await client.get_job(first.id)
    assert job.state is S.Retryable and job.concurrency_key == "k"
    # The rescued attempt's slot is free: the other job of the key gets it.
    after = await pool.fetch(q["attempt_claim_keyed"], "default", 5, 0.0, 0.0, "", 500)
    assert [r["id"] for r in after] == [second.id] and after[0]["concurrency_slot"] == 1


async def test_waiting_in_place_keeps_the_slot_parking_frees_it(client: awa.AsyncClient,
                                                                conn: asyncpg.Connection,
                                                                signals: Signals) -> None:
    tokens: dict[int, str] = {}
    finished: list[int] = []

    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> object:
        if job.args.mode == "wait":
            token = await job.register_callback(60)
            tokens[job.args.n] = token.id
            await job.wait_for_callback(token)
        elif job.args.mode == "park" and job.args.n not in tokens:
            token = await job.register_callback(60)
            tokens[job.args.n] = token.id
            return awa.WaitForCallback(token)
        finished.append(job.args.n)
        return None

    waiter = await client.insert(Work(1, mode="wait"), concurrency_key="w", max_in_flight=1)
    blocked = await client.insert(Work(2), concurrency_key="w", max_in_flight=1)
    parker = await client.insert(Work(3, mode="park"), concurrency_key="p", max_in_flight=1)
    follower = await client.insert(Work(4), concurrency_key="p", max_in_flight=1)
    await client.start(queues=[{"name": "tenants", "max_workers": 6,
                                "key_max_in_flight": 1}], **FAST)
    await wait_for_state(client, waiter.id, S.WaitingExternal)
    await wait_for_state(client, parker.id, S.WaitingExternal)
    # A parked job gave its slot back: the next job of its key ran.
    await wait_for_state(client, follower.id, S.Completed)
    # A handler waiting in place still holds its slot: the other job waits.
    await signals.claims("tenants", count=3)  # three claims since, none took it
    assert (await client.get_job(blocked.id)).state is S.Available
    await client.resume_external(tokens[1], {"ok": True})
    await wait_for_state(client, blocked.id, S.Completed)
    await wait_for_state(client, waiter.id, S.Completed)
    await client.resume_external(tokens[3], {"ok": True})
    resumed = await wait_for_state(client, parker.id, S.Completed)
    assert resumed.concurrency_key == "p"
