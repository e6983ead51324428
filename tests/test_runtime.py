"""Worker runtime: outcomes, ordering, aging, capacity, rate limits, pause, health."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from tests.helpers import FAST, explain_prepared, idle_task, wait_until

import awa
from awa.db.pool import create_pool
from awa.db.queries import queries
from awa.telemetry.signals import Signals
from awa.worker.completion import Completer

TERMINAL = {awa.JobState.Completed, awa.JobState.Failed, awa.JobState.Cancelled}


@dataclass
class Step:
    n: int
    mode: str = "ok"


async def _finished(client: awa.AsyncClient, ids: list[int]) -> list[awa.Job]:
    async def check() -> list[awa.Job] | None:
        jobs = [await client.get_job(i) for i in ids]
        return jobs if all(j.state in TERMINAL for j in jobs) else None
    result: list[awa.Job] = await wait_until(check, message="jobs to finish")
    return result


async def test_outcomes(client: awa.AsyncClient) -> None:
    runs: dict[str, int] = {}

    @client.task(Step)
    async def handle(job: awa.Job) -> object:
        mode = job.args.mode
        runs[mode] = runs.get(mode, 0) + 1
        if mode == "retry_then_ok":
            return awa.RetryAfter(0.05) if job.attempt == 1 else None
        if mode == "snooze_then_ok":
            return awa.Snooze(0.05) if runs[mode] == 1 else None
        if mode == "cancel":
            return awa.Cancel("not needed")
        if mode == "terminal":
            raise awa.TerminalError("bad input")
        if mode == "always_fails":
            raise ValueError("boom")
        if mode == "output":
            return awa.Output({"rows": 3})
        if mode == "wait_without_callback":
            return awa.WaitForCallback(awa.CallbackToken.new())
        return "anything else completes"

    modes = ["ok", "retry_then_ok", "snooze_then_ok", "cancel", "terminal", "always_fails",
             "output", "wait_without_callback"]
    ids = [(await client.insert(Step(i, m), max_attempts=2 if m == "always_fails" else 25)).id
           for i, m in enumerate(modes)]
    unknown = await client.insert({"x": 1}, kind="nobody_handles_this", max_attempts=1)
    await client.start(**FAST)
    jobs = dict(zip(modes, await _finished(client, ids), strict=True))
    S = awa.JobState
    assert jobs["ok"].state is S.Completed and jobs["ok"].attempt == 1
    assert jobs["retry_then_ok"].state is S.Completed and jobs["retry_then_ok"].attempt == 2
    assert jobs["snooze_then_ok"].state is S.Completed and jobs["snooze_then_ok"].attempt == 1
    assert runs["snooze_then_ok"] == 2
    assert jobs["cancel"].state is S.Cancelled
    assert jobs["cancel"].errors[0]["error"] == "cancelled: not needed"
    assert jobs["terminal"].state is S.Failed and jobs["terminal"].errors[0]["terminal"] is True
    assert jobs["terminal"].errors[0]["error"].startswith("TerminalError: bad input\n")
    failed = jobs["always_fails"]
    assert failed.state is S.Failed and failed.attempt == 2 and runs["always_fails"] == 2
    assert [e["attempt"] for e in failed.errors] == [1, 2]
    assert "ValueError: boom" in failed.errors[0]["error"] and "terminal" not in failed.errors[1]
    assert jobs["output"].output == {"rows": 3}
    assert jobs["wait_without_callback"].state is S.Failed
    assert all(j.finalized_at is not None for j in jobs.values())
    gone = await wait_until(lambda: _state_is(client, unknown.id, S.Failed))
    # Its only attempt ran on a worker without a handler: failed, but not as a TerminalError.
    assert "UnknownJobKind" in gone.errors[0]["error"] and "terminal" not in gone.errors[0]


async def _state_is(client: awa.AsyncClient, job_id: int, state: awa.JobState) -> awa.Job | None:
    job = await client.get_job(job_id)
    return job if job.state is state else None


async def test_sync_handler_and_undecodable_args(client: awa.AsyncClient) -> None:
    import threading

    threads: list[str] = []

    @client.task(Step)
    def handle(job: awa.Job) -> None:
        threads.append(threading.current_thread().name)
        assert isinstance(job.args, Step)

    ok = await client.insert(Step(1))
    bad = await client.insert({"unexpected": True}, kind="step")
    await client.start(**FAST)
    ok_job, bad_job = await _finished(client, [ok.id, bad.id])
    assert ok_job.state is awa.JobState.Completed
    assert threads and threads[0].startswith("awa-handler")
    assert bad_job.state is awa.JobState.Failed
    assert "do not decode" in bad_job.errors[0]["error"]


async def test_retry_backoff_bounds(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    @client.task(Step)
    async def handle(job: awa.Job) -> None:
        raise RuntimeError("again")

    job = await client.insert(Step(1))
    await client.start(**FAST)
    retried = await wait_until(lambda: _state_is(client, job.id, awa.JobState.Retryable))
    await client.shutdown()
    failed_at = datetime.fromisoformat(retried.errors[0]["at"])
    delay = (retried.run_at_datetime - failed_at).total_seconds()
    assert 2.0 - 0.01 <= delay <= 2.5 + 0.01  # 2**1 * (1 + U(0, 0.25))
    delays = [await conn.fetchval("SELECT extract(epoch FROM awa.retry_delay($1))", n)
              for n in (3, 10, 40) for _ in range(20)]
    assert all(8 <= d <= 10 for d in delays[:20])
    assert all(1024 <= d <= 1280 for d in delays[20:40])
    assert all(d == 86400 for d in delays[40:])


async def test_priority_then_fifo_order(client: awa.AsyncClient) -> None:
    order: list[int] = []

    @client.task(Step, queue="ordered")
    async def handle(job: awa.Job) -> None:
        order.append(job.args.n)

    plan = [(1, 3), (2, 1), (3, 2), (4, 1), (5, 4), (6, 2), (7, 3), (8, 1)]
    for n, priority in plan:
        await client.insert(Step(n), queue="ordered", priority=priority)
    await client.start([("ordered", 1)], **FAST)
    await wait_until(lambda: _done(order, len(plan)))
    expected = [n for n, _ in sorted(plan, key=lambda p: (p[1], p[0]))]
    assert order == expected


async def _done(seen: list[int], n: int) -> bool:
    return len(seen) >= n


async def test_priority_aging(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    order: list[int] = []

    @client.task(Step, queue="aging")
    async def handle(job: awa.Job) -> None:
        order.append(job.args.n)

    fresh = await client.insert(Step(1), queue="aging", priority=1)
    # Waited 10 minutes at a 60 s aging interval: effectively priority 1, and older.
    old = await client.insert(Step(2), queue="aging", priority=4,
                              run_at=datetime.now(UTC) - timedelta(minutes=10))
    await client.start([{"name": "aging", "max_workers": 1}], **FAST)
    await wait_until(lambda: _done(order, 2))
    assert order == [2, 1]
    await client.shutdown()
    order.clear()
    for n, p in ((3, 1), (4, 4)):
        await client.insert(Step(n), queue="aging", priority=p,
                            run_at=datetime.now(UTC) - timedelta(minutes=10))
    # Aging off: raw priority wins.
    await client.start([{"name": "aging", "max_workers": 1, "priority_aging_interval_ms": 0}],
                       **FAST)
    await wait_until(lambda: _done(order, 2))
    assert order == [3, 4]
    assert fresh.id < old.id


class ConcurrencyProbe:
    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total_peak = 0

    async def run(self, queue: str, seconds: float) -> None:
        self.now[queue] = self.now.get(queue, 0) + 1
        self.peak[queue] = max(self.peak.get(queue, 0), self.now[queue])
        self.total_peak = max(self.total_peak, sum(self.now.values()))
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now[queue] -= 1


async def test_reserved_capacity_is_never_exceeded(client: awa.AsyncClient) -> None:
    probe = ConcurrencyProbe()
    for q in ("a", "b"):
        @client.task(Step, kind=f"step_{q}", queue=q)
        async def handle(job: awa.Job) -> None:
            await probe.run(job.queue, 0.05)
    ids = [(await client.insert(Step(i), kind=f"step_{q}", queue=q)).id
           for q in ("a", "b") for i in range(30)]
    await client.start([("a", 3), ("b", 5)], **FAST)
    await _finished(client, ids)
    assert probe.peak == {"a": 3, "b": 5}


async def test_weighted_capacity(client: awa.AsyncClient) -> None:
    probe = ConcurrencyProbe()
    started = {"hi": 0, "lo": 0}
    lo_peak_while_hi_backlogged = 0
    finished_at: dict[str, float] = {}
    for q in ("hi", "lo"):
        @client.task(Step, kind=f"w_{q}", queue=q)
        async def handle(job: awa.Job) -> None:
            nonlocal lo_peak_while_hi_backlogged
            started[job.queue] += 1
            if job.queue == "lo" and started["hi"] < 40 - 6:
                lo_peak_while_hi_backlogged = max(lo_peak_while_hi_backlogged,
                                                  probe.now.get("lo", 0) + 1)
            await probe.run(job.queue, 0.05)
            finished_at[job.queue] = time.monotonic()
    ids = [(await client.insert(Step(i), kind=f"w_{q}", queue=q)).id
           for q in ("hi", "lo") for i in range(40)]
    await client.start([{"name": "hi", "min_workers": 1, "weight": 3},
                        {"name": "lo", "min_workers": 1, "weight": 1}],
                       global_max_workers=6, **FAST)
    await _finished(client, ids)
    # Never more than the global cap; while both queues have work, "lo" gets its
    # minimum (1) plus its weighted share of the 4 overflow slots (1): at most 2.
    assert probe.total_peak <= 6
    assert lo_peak_while_hi_backlogged <= 2
    assert probe.peak["hi"] >= 4
    assert finished_at["hi"] < finished_at["lo"]


async def test_rate_limit(client: awa.AsyncClient) -> None:
    starts: list[float] = []

    @client.task(Step, queue="limited")
    async def handle(job: awa.Job) -> None:
        starts.append(time.monotonic())

    ids = [(await client.insert(Step(i), queue="limited")).id for i in range(8)]
    await client.start([{"name": "limited", "max_workers": 8, "rate_limit": (10.0, 2)}], **FAST)
    await _finished(client, ids)
    # 2 at once, then 10/s: 8 jobs need at least ~0.6 s (generous lower bound).
    assert starts[-1] - starts[0] >= 0.4


async def test_paused_queue_is_not_claimed(client: awa.AsyncClient, signals: Signals) -> None:
    ran: list[int] = []

    @client.task(Step, queue="p")
    async def handle(job: awa.Job) -> None:
        ran.append(job.args.n)

    await client.pause_queue("p")
    job = await client.insert(Step(1), queue="p")
    await client.start(**FAST)
    runtime = client.runtime
    assert runtime is not None
    before = runtime.dispatchers["p"].claimed
    await signals.claims("p", count=5)  # five claims of the paused queue since
    assert ran == [] and runtime.dispatchers["p"].claimed == before
    await client.resume_queue("p")
    await _finished(client, [job.id])
    assert ran == [1]


async def test_health_check(client: awa.AsyncClient) -> None:
    idle = await client.health_check()
    assert idle.postgres_connected and not idle.poll_loop_alive
    assert idle.healthy and idle.runtime == "not running"  # the database and schema are fine

    @client.task(Step, queue="h")
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([{"name": "h", "max_workers": 4}], **FAST)

    async def leader_healthy() -> awa.HealthCheck | None:
        h = await client.health_check()
        return h if h.healthy and h.leader else None
    health = await wait_until(leader_healthy)
    assert health.heartbeat_alive and health.poll_loop_alive and not health.shutting_down
    assert health.queues["h"] == awa.QueueHealth(in_flight=0, available=0, max_workers=4,
                                                 min_workers=0, weight=1)
    await client.shutdown()
    assert (await client.health_check()).runtime == "not running"


@pytest.mark.parametrize(("queues", "options"), [
    ([("q", 0)], {}),
    ([("q", 1, 2)], {}),
    ([{"name": "q", "min_workers": 1}], {}),  # min_workers without global_max_workers
    ([{"name": "q", "max_workers": 1}], {"global_max_workers": 4}),
    ([{"name": "q", "min_workers": 5}], {"global_max_workers": 4}),
    ([{"name": "q", "bogus": 1}], {}),
    ([("q", 1), ("q", 2)], {}),
    ([{"name": "q", "rate_limit": (0, 1)}], {}),
    ([("q", 1)], {"heartbeat_interval_ms": 1000, "heartbeat_staleness_ms": 500}),
    ([("q", 1)], {"poll_interval_ms": -1}),
])
async def test_contradictory_configs_raise(client: awa.AsyncClient, queues: list[object],
                                           options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        await client.start(queues, **options)
    assert client.runtime is None


async def test_unknown_start_option_raises(client: awa.AsyncClient) -> None:
    idle_task(client, "q")
    with pytest.raises(TypeError):
        await client.start([("q", 1)], no_such_option=1)
    await client.start([("q", 1)], claimers=2, storage_transition_role="auto")  # compat knobs
    with pytest.raises(RuntimeError):
        await client.start([("q", 1)])


async def _http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = (await reader.read()).decode()
    writer.close()
    head, _, body = data.partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


async def test_health_listener(client: awa.AsyncClient, database_url: str) -> None:
    @client.task(Step, queue="hl")
    async def handle(job: awa.Job) -> None:
        return None

    with pytest.raises(ValueError, match="host:port"):
        await client.start([("hl", 1)], health_addr="nonsense")
    await client.start([("hl", 2)], health_addr="127.0.0.1:0", **FAST)
    assert client.runtime is not None and client.runtime.health_server is not None
    port = client.runtime.health_server.port
    status, body = await _http_get(port, "/healthz")
    assert status == 200 and json.loads(body)["alive"] is True

    async def ready() -> dict[str, object] | None:
        code, text = await _http_get(port, "/readyz")
        return json.loads(text) if code == 200 else None
    fields = await wait_until(ready)
    assert fields["schema_compatible"] is True and fields["postgres_connected"] is True
    job = await client.insert(Step(1), queue="hl")
    await _finished(client, [job.id])
    status, text = await _http_get(port, "/metrics")
    assert status == 200 and 'awa_job_claimed_total{queue="hl"} 1' in text
    assert "# TYPE awa_job_completed_total counter" in text
    assert (await _http_get(port, "/nope"))[0] == 404
    # A schema newer than the code makes the worker not ready (503 naming the field).
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("INSERT INTO awa.schema_migrations (version, description) "
                           "VALUES (999, 'future')")
    finally:
        await conn.close()
    status, text = await _http_get(port, "/readyz")
    assert status == 503 and json.loads(text)["schema_compatible"] is False


@pytest.mark.parametrize("filled", [True, False])
async def test_a_claimed_job_is_the_job_as_stored(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection,
                                                  filled: bool) -> None:
    """The claim returns only the columns a running attempt can hold (decoding the
    rest cost the worker time per job); the Job built from them is the stored one."""
    opts: dict[str, object] = dict(priority=3, tags=["a", "b"], metadata={"m": 1},
                                   unique_opts={}, ordering_key="k") if filled else {}
    job = await client.insert(Step(1), **opts)  # type: ignore[arg-type]
    if filled:
        await conn.execute("UPDATE awa.jobs SET errors = '[{\"error\": \"e\"}]', "
                           "progress = '{\"percent\": 5}' WHERE id = $1", job.id)
    pool = await client.pool()
    rows = await pool.fetch(queries()["attempt_claim"], "default", 1, 30.0 if filled else 0.0,
                            0.0)
    claimed = awa.Job.from_claim(rows[0])
    assert claimed == await client.get_job(job.id)
    assert (claimed.deadline is not None) == filled
    assert (claimed.tags, claimed.metadata) == ((["a", "b"], {"m": 1}) if filled else ([], {}))


async def _insert_backlog(conn: asyncpg.Connection, n: int, state: str) -> None:
    """n no-op `Backlog` jobs of priority 2 in the default queue, straight into awa.jobs."""
    await conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts) "
        "SELECT 'backlog', 'default', '{}', $2::awa.job_state, 2, 25 "
        "FROM generate_series(1, $1)", n, state)


async def test_claims_stay_fast_when_the_backlog_grows_after_start(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals) -> None:
    """A worker that starts on an empty table keeps claiming by index once a big
    backlog arrives. PostgreSQL settles on a generic plan after five runs of a
    prepared statement, and one made on the empty table scanned it whole per claim
    (1.3 s at 300,000 jobs). The runtime's pools therefore plan afresh (the
    runtime pool) or re-plan after `CLAIM_PLAN_LIFETIME` (the claim pool), both
    without JIT (a claim planned against a big backlog compiled for 0.7 s on
    PostgreSQL 15)."""
    await conn.execute("ANALYZE awa.jobs")  # statistics of an empty table, as after a drain
    idle_task(client, "default")
    await client.start([("default", 32)], **FAST)
    runtime = client.runtime
    assert runtime is not None
    for pool, mode in ((runtime._claim_pool, "force_generic_plan"),
                       (runtime._runtime_pool, "force_custom_plan")):
        assert pool is not None
        async with pool.acquire() as pooled:
            assert await pooled.fetchval("SHOW jit") == "off"
            assert await pooled.fetchval("SHOW plan_cache_mode") == mode
    done = 0

    @client.task(Backlog)
    async def handle(job: awa.JobContext) -> None:
        nonlocal done
        done += 1

    await signals.claims("default", count=6)  # idle claims on the empty table: over five
    await _insert_backlog(conn, 200000, "available")
    # A whole-table scan per claim (the bug) needs over a minute for these.
    await wait_until(lambda: asyncio.sleep(0, done >= 2000), timeout=20,
                     message="2,000 jobs of the backlog")


def _plan_nodes(plan: dict[str, object]) -> Iterator[dict[str, object]]:
    """Every node of an EXPLAIN JSON plan, each before its children."""
    yield plan
    children = plan.get("Plans", [])
    assert isinstance(children, list)
    for child in children:
        yield from _plan_nodes(child)


def _max_rows_read_from_jobs(plan: dict[str, object]) -> int:
    """The most rows any scan of awa.jobs produced in an EXPLAIN ANALYZE JSON plan."""
    return max([0, *(int(float(str(node["Actual Rows"]))) for node in _plan_nodes(plan)
                     if node.get("Relation Name") == "jobs")])


async def test_a_reused_claim_plan_reads_only_the_head_of_a_backlog_analyze_never_saw(
        database_url: str, conn: asyncpg.Connection) -> None:
    """A claim reads the top of the claim index whatever the last ANALYZE saw.

    The claim pool's generic plan was made from statistics in which almost no job
    was available (a moment of a steady load). With that estimate PostgreSQL
    chose a bitmap scan plus a sort: every available job read per claim, so
    claims slowed as a backlog grew, which made it grow further (the soak's
    2-4 s slow windows). Only the claim pool's settings change here."""
    await _insert_backlog(conn, 20000, "running")  # churn leaves pages behind
    await conn.execute("DELETE FROM awa.jobs")
    await conn.execute("VACUUM awa.jobs")
    await _insert_backlog(conn, 300, "running")
    await _insert_backlog(conn, 1, "available")
    await conn.execute("ANALYZE awa.jobs")
    await _insert_backlog(conn, 5000, "available")  # the backlog, into the free pages
    pool = await create_pool(database_url, plans="reused", max_connections=1)
    try:
        async with pool.acquire() as pooled:
            # The statement is Awa's own named SQL; the arguments are literals.
            await pooled.execute(f"PREPARE claim AS {queries()['attempt_claim']}")
            explained = await pooled.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim('default', 32, 0, 0)")
    finally:
        await pool.close()
    plan = explained[0]["Plan"]  # the pool decodes json
    assert _max_rows_read_from_jobs(plan) <= 64, json.dumps(plan, indent=1)


def _indexes_read_on_jobs(plan: dict[str, object]) -> set[str]:
    """How each scan of awa.jobs in an EXPLAIN JSON plan reads it (index or Seq Scan)."""
    return {str(node.get("Index Name", node["Node Type"])) for node in _plan_nodes(plan)
            if node.get("Relation Name") == "jobs" and str(node["Node Type"]).endswith("Scan")}


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("statement, arguments", [
    ("attempt_complete_batch", "(ARRAY[1,2,3]::bigint[], ARRAY[1,1,1]::bigint[], "
                               "ARRAY[NULL,NULL,NULL]::jsonb[], interval '1 day', NULL)"),
    ("attempt_unclaim", "(ARRAY[1,2,3]::bigint[], ARRAY[1,1,1]::bigint[])"),
])
async def test_batch_completions_find_their_jobs_by_id_whatever_analyze_saw(
        conn: asyncpg.Connection, plan_mode: str, statement: str, arguments: str) -> None:
    """Completion and unclaim batches look each job up by its primary key.

    With statistics in which few jobs were running (a steady load), PostgreSQL
    read every running job through jobs_running_idx instead, per batch; that index
    keeps an entry for each job claimed since the last vacuum, none skippable
    while any transaction is open, so each batch slowed the next and completions
    stopped for 30 s in bench/soak.py."""
    await _insert_backlog(conn, 5000, "available")
    await _insert_backlog(conn, 3, "running")
    await conn.execute("ANALYZE awa.jobs")
    plan = await explain_prepared(conn, queries()[statement], arguments, plan_mode)
    assert _indexes_read_on_jobs(plan) == {"jobs_pkey"}, json.dumps(plan, indent=1)


@pytest.mark.parametrize("statement, rest", [
    ("attempt_complete_batch", ", ARRAY[NULL,NULL,NULL]::jsonb[], interval '1 day', NULL"),
    ("attempt_unclaim", "")])
async def test_batch_completions_look_jobs_up_by_id_after_analyze_saw_an_empty_queue(
        database_url: str, conn: asyncpg.Connection, statement: str, rest: str) -> None:
    """A batch reads only its own jobs even when the last ANALYZE saw the queue
    almost empty and a backlog grew after it.

    The claim pool's reused generic plan then joined the batch to a full index
    scan of awa.jobs (the ids as a join filter): every job in the table read per
    batch, 0.7-3.4 s each at a 43,000-job backlog (bench/soak.py, auto_explain).
    Only the claim pool's own settings are used here."""
    await _insert_backlog(conn, 100_000, "running")  # churn leaves pages behind
    await conn.execute("DELETE FROM awa.jobs")
    await conn.execute("VACUUM awa.jobs")
    await _insert_backlog(conn, 3, "running")
    await conn.execute("VACUUM ANALYZE awa.jobs")  # as the leader does
    await _insert_backlog(conn, 5000, "running")  # the backlog, after the ANALYZE
    ids = [r["id"] for r in await conn.fetch(
        "SELECT id FROM awa.jobs ORDER BY id DESC LIMIT 3")]
    pool = await create_pool(database_url, plans="reused", max_connections=1)
    try:
        async with pool.acquire() as pooled:
            tx = pooled.transaction()
            await tx.start()
            # The statement is Awa's own named SQL; the arguments are literals.
            await pooled.execute(f"PREPARE batch AS {queries()[statement]}")
            id_list = ",".join(str(int(i)) for i in ids)
            explained = await pooled.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE batch(ARRAY[{id_list}]::bigint[], "
                f"ARRAY[0,0,0]::bigint[]{rest})")
            await tx.rollback()
    finally:
        await pool.close()
    plan = explained[0]["Plan"]  # the pool decodes json
    assert _max_rows_read_from_jobs(plan) <= len(ids), json.dumps(plan, indent=1)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 5003  # rolled back


def _loops_of_cte(plan: dict[str, object], name: str) -> list[int]:
    """Actual Loops of every scan of CTE `name` in an EXPLAIN ANALYZE JSON plan."""
    return [int(str(node["Actual Loops"])) for node in _plan_nodes(plan)
            if node.get("CTE Name") == name]


async def test_a_heartbeat_of_many_attempts_reads_what_it_wrote_once(
        conn: asyncpg.Connection) -> None:
    """A heartbeat pass is linear in its attempts whatever ANALYZE saw.

    It reported each attempt as owned and written by joining the rows it found
    to the rows it updated; estimating few running jobs, PostgreSQL rescanned
    the updated rows once per attempt (3 s for 6,000 attempts; the soak's stalled
    worker, heartbeating tens of thousands of unwritten completions, hit the
    30-s statement timeout). Here: 600 attempts among 20,000 queued jobs."""
    await _insert_backlog(conn, 20000, "available")
    await _insert_backlog(conn, 600, "running")
    await conn.execute("ANALYZE awa.jobs")
    ids = [r["id"] for r in await conn.fetch(
        "SELECT id FROM awa.jobs WHERE state = 'running' ORDER BY id")]
    args = (ids, [0] * len(ids), [None] * len(ids), None)
    sql = queries()["attempt_heartbeat"]
    explained = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
    plan = explained[0]["Plan"]
    assert _loops_of_cte(plan, "beat") == [1], json.dumps(plan, indent=1)
    rows = await conn.fetch(sql, *args)
    assert sorted((r["id"], r["written"]) for r in rows) == [(i, True) for i in ids]


@dataclass
class Backlog:
    pass


@dataclass
class Ahead:
    n: int
    block: bool = False
    seconds: float = 0.0


@pytest.mark.parametrize("warm_up_seconds, ahead", [(0.0, 4), (0.03, 0)])
async def test_quick_queues_claim_ahead_and_hand_back_unstarted_jobs(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals,
        warm_up_seconds: float, ahead: int) -> None:
    """Once its handlers prove quick, a queue claims a batch beyond its free slots
    (the next claim overlaps the running batch). Those jobs stay heartbeated while
    they wait, and a stopping worker hands them back unstarted, attempt uncounted.
    Slow handlers never claim ahead."""
    started: list[int] = []
    never = asyncio.Event()

    @client.task(Ahead)
    async def handle(job: awa.JobContext) -> None:
        started.append(job.args.n)
        await asyncio.sleep(job.args.seconds)
        if job.args.block:
            await never.wait()

    warm = [(await client.insert(Ahead(i, seconds=warm_up_seconds))).id for i in range(20)]
    await client.start([{"name": "default", "max_workers": 2, "claim_batch_size": 4}], **FAST)
    await _finished(client, warm)
    blocked = [(await client.insert(Ahead(100 + i, block=True))).id for i in range(10)]

    async def running() -> list[asyncpg.Record]:
        return await conn.fetch("SELECT id, run_lease FROM awa.jobs_all WHERE state = 'running' "
                                "ORDER BY id")

    async def settled() -> list[asyncpg.Record] | None:
        rows = await running()
        return rows if len(rows) == 2 + ahead and len(started) == 22 else None

    claimed = await wait_until(settled, message=f"2 running and {ahead} claimed ahead")
    assert [r["id"] for r in claimed] == blocked[:2 + ahead]  # in claim order
    # A rescue pass begun over twice the staleness later would take unbeaten jobs.
    stale = 2 * FAST["heartbeat_staleness_ms"] / 1000
    await signals.pass_after("rescue", after=time.monotonic() + stale)
    assert await running() == claimed
    assert sorted(started[20:]) == [100, 101]  # the jobs claimed ahead never started
    await client.shutdown(timeout_ms=200)
    rows = await conn.fetch("SELECT id, state::text, attempt FROM awa.jobs_all "
                            "WHERE state NOT IN ('completed', 'failed', 'cancelled') ORDER BY id")
    assert [(r["id"], r["state"], r["attempt"]) for r in rows] == (
        [(i, "running", 1) for i in blocked[:2]]  # abandoned handlers: left for rescue
        + [(i, "available", 0) for i in blocked[2:]])


async def test_a_quick_queue_claims_up_to_the_default_batch_of_512_at_once(
        client: awa.AsyncClient, signals: Signals) -> None:
    """By default a queue of quick handlers claims up to `CLAIM_BATCH_SIZE` (512)
    jobs per statement, most of them ahead of its free slots: a claim's fixed
    cost is spread over that many jobs. Never more than that."""
    assert awa.worker.config.QueueConfig(name="x").claim_batch_size == 512

    @client.task(Step)
    async def handle(job: awa.Job) -> None:
        return None

    warm = [(await client.insert(Step(i))).id for i in range(40)]
    await client.start([("default", 4)], **FAST)
    await _finished(client, warm)  # the handlers have shown they are quick
    since = signals.mark()
    ids = [j.id for j in await client.insert_many([Step(100 + i) for i in range(1500)])]
    jobs = await _finished(client, ids)
    assert {j.state for j in jobs} == {awa.JobState.Completed}
    sizes = [s.data["jobs"] for s in signals.history[since:]
             if s.name == "claim" and s.data["queue"] == "default"]
    assert max(sizes) > 128 and max(sizes) <= 512, sizes


def test_jobs_claimed_ahead_are_what_the_slots_run_in_a_tenth_of_a_second() -> None:
    """Claimed ahead, a job's deadline already runs: a queue claims ahead only
    what its slots get through in `CLAIM_AHEAD_WAIT` at its handlers' average,
    at most its batch; handlers slower than `CLAIM_AHEAD_MAX_RUN`, nothing."""
    from awa.worker.dispatcher import claim_ahead
    assert claim_ahead(512, 32, 0.0001) == 512  # quick handlers: the whole batch
    assert claim_ahead(512, 32, 0.0) == 512
    assert claim_ahead(512, 1, 0.005) == 20  # one slot of 5 ms: 0.1 s of work
    assert claim_ahead(512, 4, 0.002) == 200
    assert claim_ahead(512, 32, 0.006) == 0  # slower than 5 ms: none
    assert claim_ahead(4, 2, 0.0) == 4


async def test_claims_keep_their_connections_and_borrow_anew_once_they_are_lost(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """A one-queue worker claims and completes through connections it keeps
    (asyncpg's borrow and return per statement was a tenth of its CPU). If the
    server ends those sessions, the next statements borrow new ones: jobs
    inserted afterwards still complete, each once."""
    runs: list[int] = []

    @client.task(Step)
    async def handle(job: awa.Job) -> None:
        runs.append(job.args.n)

    first = [(await client.insert(Step(i))).id for i in range(40)]
    await client.start([("default", 4)], **FAST)
    await _finished(client, first)
    claim_sessions = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'awa-claim' "
                      "AND datname = current_database()")
    kept = {r["pid"] for r in await conn.fetch(claim_sessions)}
    assert 1 <= len(kept) <= 3  # the claim pool's size: nothing borrowed beyond it
    await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE application_name = 'awa-claim' AND datname = current_database()")
    second = [(await client.insert(Step(100 + i))).id for i in range(40)]
    jobs = await _finished(client, second)
    assert {j.state for j in jobs} == {awa.JobState.Completed}
    assert sorted(runs) == list(range(40)) + list(range(100, 140))
    now = {r["pid"] for r in await conn.fetch(claim_sessions)}
    assert now and not now & kept  # every claim session is a new one


async def test_a_worker_of_more_queues_than_claim_connections_serves_them_all(
        client: awa.AsyncClient) -> None:
    """Dispatchers keep a claim connection only while the claim pool has one to
    spare for each: with more queues than that, they borrow per claim, so no
    queue waits for a connection another queue keeps."""
    queues = [f"q{i}" for i in range(5)]
    for q in queues:
        @client.task(Step, kind=f"many_{q}", queue=q)
        async def handle(job: awa.Job) -> None:
            return None
    ids = [(await client.insert(Step(i), kind=f"many_{q}", queue=q)).id
           for q in queues for i in range(10)]
    await client.start([(q, 2) for q in queues], **FAST)
    jobs = await _finished(client, ids)
    assert {j.state for j in jobs} == {awa.JobState.Completed}


async def test_a_completion_batch_keeps_each_output_whether_or_not_others_have_one(
        client: awa.AsyncClient) -> None:
    """A batch with no outputs sends NULL in place of their array; mixed with
    jobs that have one, each job still gets its own output (or none)."""
    ids = [(await client.insert(Step(i))).id for i in range(6)]
    pool = await client.pool()
    q = queries()
    rows = await pool.fetch(q["attempt_claim"], "default", 6, 0.0, 0.0)
    lease = {r["id"]: r["run_lease"] for r in rows}
    slot = {r["id"]: r["receipt_slot"] for r in rows}  # where a ring attempt's receipt is
    completer = Completer(pool, q, completed_retention=timedelta(days=1),
                          failed_retention=timedelta(days=1))
    completer.start()
    try:
        for job_id in ids[:3]:  # one batch without outputs
            completer.complete(job_id, lease[job_id], slot=slot[job_id])
        await completer.drain()
        for n, job_id in enumerate(ids[3:]):  # one batch mixing them
            completer.complete(job_id, lease[job_id], json.dumps({"n": n}) if n != 1 else None,
                               slot=slot[job_id])
        await completer.drain()
    finally:
        await completer.stop()
    jobs = [await client.get_job(i) for i in ids]
    assert all(j.state is awa.JobState.Completed for j in jobs)
    assert [j.output for j in jobs] == [None, None, None, {"n": 0}, None, {"n": 2}]
