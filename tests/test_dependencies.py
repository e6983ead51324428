"""Job dependencies: after=, policies, workflows (chain / group / chord), races."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import FAST, TO_MUTABLE, wait_until

import awa
from awa import chain, chord, group, step

S = awa.JobState
TERMINAL = {S.Completed, S.Failed, S.Cancelled}


@dataclass
class Work:
    name: str
    mode: str = "ok"


async def _state(client: awa.AsyncClient, job_id: int) -> S | None:
    try:
        return (await client.get_job(job_id)).state
    except awa.JobNotFound:
        return None


async def _finish(conn: asyncpg.Connection, job_id: int, state: str = "completed") -> None:
    """Finish an active job the way the runtime's statements do (a move to jobs_done)."""
    await conn.execute(TO_MUTABLE, job_id)  # a ring job moves to awa.jobs first
    await conn.execute(
        "WITH moved AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
        "INSERT INTO awa.jobs_done SELECT f.* FROM moved m, "
        "LATERAL awa.finished(m.j, $2::awa.job_state, interval '1 hour') f", job_id, state)


async def _edges(conn: asyncpg.Connection, child: int) -> list[tuple[int, str | None]]:
    rows = await conn.fetch("SELECT parent_id, parent_state::text FROM awa.job_dependencies "
                            "WHERE child_id = $1 ORDER BY ordinal", child)
    return [(r[0], r[1]) for r in rows]


# -- after= and policies, without a worker -------------------------------------------


async def test_child_waits_until_every_parent_completed(client: awa.AsyncClient,
                                                        conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    b = await client.insert(Work("b"))
    child = await client.insert(Work("c"), after=[a, b.id])
    assert child.state is S.Scheduled and child.run_at_datetime.year == 9999
    assert (await client.get_job(a.id)).metadata == {"_awa_dependents": True}
    await _finish(conn, a.id)
    assert await _state(client, child.id) is S.Scheduled
    await _finish(conn, b.id)
    promoted = await client.get_job(child.id)
    assert promoted.state is S.Available and promoted.run_at_datetime.year < 9999
    assert await _edges(conn, child.id) == [(a.id, "completed"), (b.id, "completed")]


@pytest.mark.parametrize(("policy", "expected"), [("cancel", S.Cancelled),
                                                  ("run_anyway", S.Available),
                                                  ("discard", None)])
@pytest.mark.parametrize("parent_end", ["failed", "cancelled"])
async def test_parent_failure_policies(client: awa.AsyncClient, conn: asyncpg.Connection,
                                       policy: str, expected: S | None, parent_end: str) -> None:
    a = await client.insert(Work("a"))
    b = await client.insert(Work("b"))
    child = await client.insert(Work("c"), after=[a, b], on_parent_failure=policy)  # type: ignore[arg-type]
    grandchild = await client.insert(Work("d"), after=[child])
    await _finish(conn, a.id, parent_end)
    await _finish(conn, b.id)
    assert await _state(client, child.id) is expected
    if expected is S.Cancelled:
        job = await client.get_job(child.id)
        assert job.errors[-1]["error"] == f"parent job {a.id} {parent_end}"
    # A cancelled or discarded child releases its own children as a cancelled parent.
    assert await _state(client, grandchild.id) is (
        S.Scheduled if expected is S.Available else S.Cancelled)


async def test_parents_already_finished_at_insert(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection) -> None:
    done = await client.insert(Work("done"))
    failed = await client.insert(Work("failed"))
    await _finish(conn, done.id)
    await _finish(conn, failed.id, "failed")
    runs_now = await client.insert(Work("x"), after=[done])
    assert runs_now.state is S.Available
    cancelled = await client.insert(Work("y"), after=[done, failed])
    assert cancelled.state is S.Cancelled
    anyway = await client.insert(Work("z"), after=[failed], on_parent_failure="run_anyway")
    assert anyway.state is S.Available
    before = await conn.fetchval("SELECT count(*) FROM awa.jobs_all")
    with pytest.raises(awa.ValidationError) as err:
        await client.insert(Work("w"), after=[failed], on_parent_failure="discard")
    assert err.value.field == "after"
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == before


async def test_bad_after_is_refused_before_anything_is_written(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    cases: list[tuple[object, dict[str, object], str]] = [
        ([], {}, "after"), ("12", {}, "after"), ([True], {}, "after"), ([0], {}, "after"),
        ([a.id, 10_000_000], {}, "after"), ([a], {"on_parent_failure": "maybe"},
                                            "on_parent_failure"),
        ([a], {"run_at": "2030-01-01T00:00:00+00:00"}, "run_at")]
    for after, opts, field in cases:
        with pytest.raises(awa.ValidationError) as err:
            await client.insert(Work("c"), after=after, **opts)  # type: ignore[arg-type]
        assert err.value.field == field, (after, opts)
    with pytest.raises(awa.ValidationError) as err:
        await client.insert(Work("c"), on_parent_failure="run_anyway")
    assert err.value.field == "on_parent_failure"
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 0


async def test_duplicate_parents_count_once(client: awa.AsyncClient,
                                            conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    child = await client.insert(Work("c"), after=[a, a.id])
    assert await _edges(conn, child.id) == [(a.id, None)]


# -- workflows ---------------------------------------------------------------------------


async def test_workflow_insert_is_atomic(client: awa.AsyncClient,
                                         conn: asyncpg.Connection) -> None:
    await client.insert(Work("taken"), unique_opts={"by_args": True})
    flow = chain(Work("a"), group(Work("b"), Work("c")),
                 step(Work("taken"), unique_opts={"by_args": True}))
    with pytest.raises(awa.UniqueConflict):
        await client.enqueue_workflow(flow)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 1
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 0
    # A bad step is refused before any write.
    with pytest.raises(awa.ValidationError):
        await client.enqueue_workflow(chain(Work("a"), step(Work("b"), priority=9)))
    with pytest.raises(awa.ValidationError):
        chain()
    with pytest.raises(awa.ValidationError):
        step(Work("a"), run_at="2030-01-01T00:00:00+00:00")
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 1


async def test_chain_group_chord_run_end_to_end(client: awa.AsyncClient) -> None:
    order: list[str] = []
    seen: dict[str, list[awa.ParentResult]] = {}

    @client.task(Work)
    async def handle(job: awa.JobContext) -> object:
        order.append(job.args.name)
        if job.args.name.startswith("sum"):
            seen[job.args.name] = await job.parent_outputs()
            return awa.Output(sum(p.output for p in seen[job.args.name]))
        await asyncio.sleep(0.01)
        return awa.Output(len(job.args.name))

    run = await client.enqueue_workflow(
        chain(Work("first"),
              chord(group(Work("x"), Work("yy"), Work("zzz")), Work("sum1")),
              Work("last")))
    assert [j.state for j in run.jobs] == [S.Available] + [S.Scheduled] * 5
    assert [j.args["name"] for j in run.tails] == ["last"]
    await client.start(**FAST)
    ids = [j.id for j in run.jobs]

    async def all_done() -> bool:
        return all([await _state(client, i) is S.Completed for i in ids])
    await wait_until(all_done, message="the workflow to finish")
    assert order[0] == "first" and set(order[1:4]) == {"x", "yy", "zzz"}
    assert order[4:] == ["sum1", "last"]
    assert [p.output for p in seen["sum1"]] == [1, 2, 3]
    assert [p.state for p in seen["sum1"]] == ["completed"] * 3
    assert (await client.get_job(run.jobs[4].id)).output == 6


async def test_failing_step_cancels_the_rest_of_the_chain(client: awa.AsyncClient) -> None:
    ran: list[str] = []

    @client.task(Work)
    async def handle(job: awa.JobContext) -> None:
        ran.append(job.args.name)
        if job.args.mode == "fail":
            raise awa.TerminalError("no")

    run = await client.enqueue_workflow(
        chain(Work("a"), Work("b", "fail"), Work("c"),
              step(Work("d"), on_parent_failure="run_anyway"), Work("e")))
    await client.start(**FAST)
    ids = [j.id for j in run.jobs]

    async def settled() -> list[S | None] | None:
        states = [await _state(client, i) for i in ids]
        return states if all(s in TERMINAL for s in states) else None
    states = await wait_until(settled, message="the chain to settle")
    # c is cancelled; d (run_anyway) runs after its cancelled parent, then e.
    assert states == [S.Completed, S.Failed, S.Cancelled, S.Completed, S.Completed]
    assert ran == ["a", "b", "d", "e"]


# -- races and crashes -------------------------------------------------------------------


async def _blocked(conn: asyncpg.Connection, pid: int) -> bool:
    return bool(await conn.fetchval(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))


async def _connect(database_url: str) -> asyncpg.Connection:
    return await asyncpg.connect(database_url)


async def test_two_parents_finishing_at_once_promote_exactly_once(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    a = await client.insert(Work("a"))
    b = await client.insert(Work("b"))
    child = await client.insert(Work("c"), after=[a, b])
    one, two = await _connect(database_url), await _connect(database_url)
    try:
        await one.execute("BEGIN")
        await two.execute("BEGIN")
        await _finish(one, a.id)  # holds the child's row lock until it commits
        second = asyncio.create_task(_finish(two, b.id))
        await wait_until(lambda: _blocked(conn, two.get_server_pid()),
                         message="the second parent to wait for the child's lock")
        # Without the lock each would count the other's edge as open: child stranded.
        await one.execute("COMMIT")
        await second
        await two.execute("COMMIT")
    finally:
        await one.close()
        await two.close()
    assert await _state(client, child.id) is S.Available
    assert await _edges(conn, child.id) == [(a.id, "completed"), (b.id, "completed")]


@pytest.mark.parametrize("first", ["cancel", "complete"])
async def test_parent_completing_while_child_is_cancelled(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str,
        first: str) -> None:
    parent = await client.insert(Work("p"))
    child = await client.insert(Work("c"), after=[parent])
    grandchild = await client.insert(Work("g"), after=[child])
    one, two = await _connect(database_url), await _connect(database_url)
    cancel_sql = ("WITH moved AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
                  "INSERT INTO awa.jobs_done SELECT f.* FROM moved m, "
                  "LATERAL awa.finished(m.j, 'cancelled', interval '1 hour') f")
    try:
        await one.execute("BEGIN")
        await two.execute("BEGIN")
        if first == "cancel":
            await one.execute(cancel_sql, child.id)
            late = asyncio.create_task(_finish(two, parent.id))
        else:
            await one.execute(
                "WITH moved AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
                "INSERT INTO awa.jobs_done SELECT f.* FROM moved m, "
                "LATERAL awa.finished(m.j, 'completed', interval '1 hour') f", parent.id)
            late = asyncio.create_task(two.execute(cancel_sql, child.id))
        await wait_until(lambda: _blocked(conn, two.get_server_pid()),
                         message="the second transaction to wait for the first")
        await one.execute("COMMIT")
        await late
        await two.execute("COMMIT")
    finally:
        await one.close()
        await two.close()
    # Exactly one outcome: the child is cancelled (never run), its own child with it.
    assert await _state(client, child.id) is S.Cancelled
    assert await _state(client, grandchild.id) is S.Cancelled
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    assert await conn.fetchval(
        "SELECT count(*) FROM awa.job_dependencies WHERE resolved_at IS NULL") == 0


async def test_parent_lock_keeps_an_edge_from_being_missed(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """A parent finishing while its child is being inserted waits for that insert to
    commit, then releases the child (no child left parked forever)."""
    async def one_child(tx: awa.Transaction, parent: awa.Job) -> list[int]:
        return [(await tx.insert(Work("c"), after=[parent])).id]

    [child] = await insert_while_parent_finishes(client, conn, database_url, one_child)
    assert await _state(client, child) is S.Available


async def insert_while_parent_finishes(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str,
        insert: Callable[[awa.Transaction, awa.Job], Awaitable[list[int]]]) -> list[int]:
    """Insert children of a new parent in a transaction whose commit the parent's
    finish (on another connection) is seen waiting for; returns the children's ids."""
    parent = await client.insert(Work("p"))
    inserter = awa.AsyncClient(database_url)
    finisher = await _connect(database_url)
    try:
        async with inserter.transaction() as tx:
            children = await insert(tx, parent)
            done = asyncio.create_task(_finish(finisher, parent.id))
            await wait_until(lambda: _blocked(conn, finisher.get_server_pid()),
                             message="the parent's finish to wait for the insert")
        await done
    finally:
        await inserter.close()
        await finisher.close()
    return children


async def test_child_runs_once_when_the_parents_worker_is_killed(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """SIGKILL while the parent runs: rescue re-runs the parent, whose completion
    releases the child once; the child runs exactly once."""
    import signal

    from tests.helpers import spawn_worker
    parent = await client.insert({"seconds": 30, "marker": "p"}, kind="sleepy", queue="procs")
    child = await client.insert({"seconds": 0, "marker": "c"}, kind="sleepy", queue="procs",
                                after=[parent])
    proc = spawn_worker(database_url)
    try:
        async def parent_running() -> bool:  # its handler has recorded the run
            return bool(await conn.fetchval("SELECT to_regclass('runs') IS NOT NULL")) and bool(
                await conn.fetchval("SELECT count(*) FROM runs WHERE job_id = $1", parent.id))
        await wait_until(parent_running, timeout=30, message="the worker to run the parent")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await _state(client, child.id) is S.Scheduled
    await conn.execute("UPDATE awa.jobs SET args = '{\"seconds\": 0}' WHERE id = $1", parent.id)
    proc = spawn_worker(database_url)
    try:
        async def child_done() -> bool:
            return await _state(client, child.id) is S.Completed
        await wait_until(child_done, timeout=60, message="rescue, parent and child")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    runs = await conn.fetch("SELECT job_id, count(*) AS n FROM runs GROUP BY job_id")
    assert {r["job_id"]: r["n"] for r in runs} == {parent.id: 2, child.id: 1}


async def test_uncommitted_and_stale_completions_release_nothing(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """A completion that dies before its commit releases nothing; the next attempt's
    does, once; a late write from the dead attempt changes nothing."""
    from datetime import timedelta

    from awa.db.queries import queries
    parent = await client.insert(Work("p"))
    child = await client.insert(Work("c"), after=[parent])
    pool = await client.pool()
    q = queries()
    lease = (await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 60.0))[0]["run_lease"]
    dying = await _connect(database_url)
    await dying.execute("BEGIN")
    await dying.fetch(q["attempt_complete_batch"], [parent.id], [lease], None,
                      timedelta(days=1), None)
    await conn.execute("SELECT pg_terminate_backend($1)", dying.get_server_pid())
    await asyncio.sleep(0)  # (the server ends it; the transaction is rolled back)
    await dying.close()
    assert await _state(client, child.id) is S.Scheduled
    # Rescued and claimed again; the new attempt completes and releases the child.
    await conn.execute("UPDATE awa.jobs SET state = 'available' WHERE id = $1", parent.id)
    second = (await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 60.0))[0]["run_lease"]
    await pool.fetch(q["attempt_complete_batch"], [parent.id], [second], None,
                     timedelta(days=1), None)
    assert await _state(client, child.id) is S.Available
    claimed = await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 60.0)
    assert [r["id"] for r in claimed] == [child.id]
    # The dead attempt's write, replayed late: nothing (the parent is not running).
    assert await pool.fetch(q["attempt_complete_batch"], [parent.id], [lease], None,
                            timedelta(days=1), None) == []
    assert (await client.get_job(child.id)).state is S.Running


# -- surfaces ------------------------------------------------------------------------------


async def test_workflow_graph_and_cli(client: awa.AsyncClient, conn: asyncpg.Connection,
                                      database_url: str) -> None:
    from tests.test_cli import awa_cli
    run = await client.enqueue_workflow(chord([Work("a"), Work("b")], Work("sum")))
    a, b, total = run.jobs
    await _finish(conn, a.id)
    graph = await client.workflow(total.id)
    assert [n.id for n in graph.nodes] == [a.id, b.id, total.id]
    assert [[n.id for n in layer] for layer in graph.layers()] == [[a.id, b.id], [total.id]]
    assert [n.status for n in graph.nodes] == ["completed", "available", "waiting"]
    assert graph.nodes[2].waiting_on == 1
    with pytest.raises(awa.JobNotFound):
        await client.workflow(999_999)
    out = awa_cli(database_url, "workflow", "show", str(a.id), "--json")
    assert out.returncode == 0, out.stderr
    import json
    doc = json.loads(out.stdout)
    assert [n["status"] for n in doc["nodes"]] == ["completed", "available", "waiting"]
    table = awa_cli(database_url, "workflow", "show", str(b.id))
    assert table.returncode == 0 and "waiting" in table.stdout and f"{a.id}:completed" in \
        table.stdout
    missing = awa_cli(database_url, "workflow", "show", "999999")
    assert missing.returncode == 1 and "not found" in missing.stderr


async def test_cleanup_prunes_old_resolved_edges_only(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection) -> None:
    from datetime import timedelta

    from awa.db.queries import queries
    from awa.maintenance.services import Cleaner
    a = await client.insert(Work("a"))
    old = await client.insert(Work("old"), after=[a])
    waiting = await client.insert(Work("waiting"), after=[await client.insert(Work("b"))])
    await _finish(conn, a.id)
    await conn.execute("UPDATE awa.job_dependencies SET resolved_at = now() - interval '73 h' "
                       "WHERE child_id = $1", old.id)
    cleaner = Cleaner(await client.pool(), queries(), timedelta(seconds=60), lambda: True,
                      retentions=[timedelta(days=1)], batch_size=100,
                      dlq_retention=timedelta(days=30))
    await cleaner.run_once()
    rows = await conn.fetch("SELECT child_id FROM awa.job_dependencies")
    assert [r[0] for r in rows] == [waiting.id]


async def test_every_way_a_parent_finishes_releases_its_children(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """Admin cancel, queue drain and a dead-lettered failure all finish the parent in
    one statement; the trigger releases the children in it."""
    from datetime import timedelta

    from awa.db.queries import queries
    cancelled = await client.insert(Work("p1"))
    c1 = await client.insert(Work("c1"), after=[cancelled])
    await client.cancel(cancelled.id)
    assert await _state(client, c1.id) is S.Cancelled

    drained = await client.insert(Work("p2"), queue="drained")
    c2 = await client.insert(Work("c2"), after=[drained], on_parent_failure="run_anyway")
    assert await client.drain_queue("drained") == 1
    assert await _state(client, c2.id) is S.Available

    dead = await client.insert(Work("p3"), queue="dlq_on")
    c3 = await client.insert(Work("c3"), after=[dead], on_parent_failure="discard")
    await conn.execute("INSERT INTO awa.queues (queue, dlq_enabled) VALUES ('dlq_on', true)")
    pool = await client.pool()
    q = queries()
    lease = (await pool.fetch(q["attempt_claim"], "dlq_on", 1, 0.0, 60.0))[0]["run_lease"]
    row = await pool.fetchrow(q["attempt_fail"], dead.id, lease, "boom", timedelta(days=1),
                              None, True)
    assert row["dlq"] is True
    assert await _state(client, c3.id) is None  # discarded: no row anywhere
    assert await _edges(conn, c3.id) == [(dead.id, "failed")]

    # Cancelling a parked child cancels its own children (it never runs).
    parent = await client.insert(Work("p4"))
    child = await client.insert(Work("c4"), after=[parent])
    grandchild = await client.insert(Work("g4"), after=[child])
    await client.cancel(child.id)
    assert await _state(client, grandchild.id) is S.Cancelled
    await _finish(conn, parent.id)  # the cancelled child stays cancelled
    assert await _state(client, child.id) is S.Cancelled
    assert await conn.fetchval(
        "SELECT count(*) FROM awa.job_dependencies WHERE resolved_at IS NULL") == 0


async def test_a_long_chain_failing_at_its_head_cancels_every_job(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """The release is a worklist, not recursion: a 500-job chain fails in one statement."""
    run = await client.enqueue_workflow(chain(*[Work(f"n{i}") for i in range(500)]))
    await _finish(conn, run.jobs[0].id, "failed")
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_active") == 0
    assert await conn.fetchval(
        "SELECT count(*) FROM awa.jobs_done WHERE state = 'cancelled'") == 499


async def test_workflow_in_a_transaction_rolls_back_with_it(client: awa.AsyncClient,
                                                            conn: asyncpg.Connection) -> None:
    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            run = await tx.enqueue_workflow(chain(Work("a"), Work("b")))
            assert len(run.jobs) == 2
            raise RuntimeError("the application's own write failed")
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 0


def test_sync_client_workflow(sync_client: awa.Client) -> None:
    run = sync_client.enqueue_workflow(group(Work("a"), Work("b")))
    child = sync_client.insert(Work("c"), after=run.jobs)
    assert child.state is S.Scheduled
    assert [n.id for n in sync_client.workflow(child.id).nodes] == [*(j.id for j in run.jobs),
                                                                   child.id]


async def test_the_guides_example_runs(database_url: str) -> None:
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, SUBPROCESS_PATH
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(ROOT / "examples" / "workflows.py")], env=env,
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["workflow of 5 jobs, first job 1",
                                        "pages: 54 bytes, to ops@example.com"]
    guide = (ROOT / "docs" / "guide" / "workflows.md").read_text()
    assert (ROOT / "examples" / "workflows.py").read_text().split('"""', 2)[2].strip() in guide
