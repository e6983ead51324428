"""Job dependencies: after=, policies, workflows (chain / group / chord), races."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import FAST, wait_until

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
