"""after= on the bulk paths (insert_many_copy, enqueue_many_copy, tx.insert_many) and
workflows that wait for existing jobs (enqueue_workflow(after=...)).

The single-insert semantics are tested in test_dependencies.py; here every other
path must give the same: validation before any write, the child and its edges in
one transaction, finished parents applied at once, the parent lock against a
parent finishing unseen.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from tests.test_dependencies import S, Work, _edges, _finish, _state, insert_while_parent_finishes

import awa
from awa import chain, chord, group, step


async def _counts(conn: asyncpg.Connection) -> tuple[int, int]:
    return (await conn.fetchval("SELECT count(*) FROM awa.jobs_all"),
            await conn.fetchval("SELECT count(*) FROM awa.job_dependencies"))


# -- bulk inserts ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["insert_many_copy", "enqueue_many_copy", "tx.insert_many"])
async def test_bulk_children_wait_for_their_parents(client: awa.AsyncClient,
                                                    conn: asyncpg.Connection, path: str) -> None:
    a = await client.insert(Work("a"))
    b = await client.insert(Work("b"))
    jobs = [Work(f"c{n}") for n in range(4)]
    # Shared after=[a]; job 1 waits for b instead, job 2 for nothing, job 3 for a
    # and b with its own policy.
    opts = [None, {"after": [b]}, {"after": None, "priority": 1},
            {"after": [a.id, b.id], "on_parent_failure": "run_anyway"}]
    if path == "insert_many_copy":
        await client.insert_many_copy(jobs, opts=opts, after=[a])
    elif path == "enqueue_many_copy":
        assert await client.enqueue_many_copy(jobs, opts=opts, after=[a]) == 4
    else:
        async with client.transaction() as tx:
            await tx.insert_many(jobs, opts=opts, after=[a])
    rows = await conn.fetch("SELECT id, state::text, priority, run_at FROM awa.jobs_active "
                            "WHERE id > $1 ORDER BY id", b.id)
    ids = [r["id"] for r in rows]
    assert [r["state"] for r in rows] == ["scheduled", "scheduled", "available", "scheduled"]
    assert rows[2]["priority"] == 1 and rows[0]["run_at"].year == 9999
    assert await _edges(conn, ids[0]) == [(a.id, None)]
    assert await _edges(conn, ids[1]) == [(b.id, None)]
    assert await _edges(conn, ids[2]) == []
    assert await _edges(conn, ids[3]) == [(a.id, None), (b.id, None)]
    assert await conn.fetchval("SELECT policy FROM awa.job_dependencies WHERE child_id = $1 "
                               "LIMIT 1", ids[3]) == "run_anyway"
    assert (await client.get_job(a.id)).metadata == {"_awa_dependents": True}
    await _finish(conn, a.id, "failed")
    assert [await _state(client, i) for i in ids] == [S.Cancelled, S.Scheduled, S.Available,
                                                      S.Scheduled]
    await _finish(conn, b.id)
    assert [await _state(client, i) for i in ids] == [S.Cancelled, S.Available, S.Available,
                                                      S.Available]


async def test_bulk_with_parents_already_finished(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection) -> None:
    done = await client.insert(Work("done"))
    failed = await client.insert(Work("failed"))
    running = await client.insert(Work("running"))
    await _finish(conn, done.id)
    await _finish(conn, failed.id, "failed")
    jobs = await client.insert_many_copy(
        [Work("x"), Work("y"), Work("z"), Work("w")],
        opts=[{"after": [done]}, {"after": [done, failed]},
              {"after": [failed], "on_parent_failure": "run_anyway"}, {"after": [running]}])
    # The returned jobs are as they stand after the finished parents applied.
    assert [j.state for j in jobs] == [S.Available, S.Cancelled, S.Available, S.Scheduled]
    assert jobs[1].errors[-1]["error"] == f"parent job {failed.id} failed"
    assert await _edges(conn, jobs[0].id) == [(done.id, "completed")]
    assert await client.enqueue_many_copy([Work("v")], after=[done]) == 1
    assert await conn.fetchval("SELECT state::text FROM awa.jobs_active ORDER BY id DESC LIMIT 1") \
        == "available"


async def test_bulk_refusals_write_nothing(client: awa.AsyncClient,
                                           conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    failed = await client.insert(Work("failed"))
    await _finish(conn, failed.id, "failed")
    before = await _counts(conn)
    two = [Work("x"), Work("y")]
    cases: list[tuple[dict[str, object], str]] = [
        ({"after": [a.id, 10_000_000]}, "after"),
        ({"opts": [None, {"after": [10_000_000]}]}, "after"),
        ({"after": [failed], "on_parent_failure": "discard"}, "after"),
        ({"opts": [{"after": [a]}, {"after": [failed], "on_parent_failure": "discard"}]},
         "after"),
        ({"on_parent_failure": "run_anyway"}, "on_parent_failure"),
        ({"opts": [None, {"on_parent_failure": "run_anyway"}]}, "on_parent_failure"),
        ({"after": [a], "on_parent_failure": "maybe"}, "on_parent_failure"),
        ({"after": []}, "after"),
        ({"after": [a], "run_at": "2030-01-01T00:00:00+00:00"}, "run_at"),
    ]
    for kwargs, field in cases:
        for method in (client.insert_many_copy, client.enqueue_many_copy):
            with pytest.raises(awa.ValidationError) as err:
                await method(two, **kwargs)  # type: ignore[operator]
            assert err.value.field == field, (method, kwargs)
    with pytest.raises(awa.ValidationError, match=r"opts\[1\]"):
        await client.insert_many_copy(two, opts=[None, {"after": ["x"]}])
    assert await _counts(conn) == before
    # The shared policy is the default of the jobs that name their own parents.
    await client.insert_many_copy(two, opts=[None, {"after": [a]}],
                                  on_parent_failure="run_anyway")
    assert await conn.fetchval("SELECT policy FROM awa.job_dependencies") == "run_anyway"


async def test_bulk_unique_skip_and_transaction_rollback(client: awa.AsyncClient,
                                                         conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    taken = await client.insert(Work("taken"), unique_opts={"by_args": True})
    jobs = await client.insert_many_copy([Work("taken"), Work("new")], after=[a],
                                         unique_opts={"by_args": True})
    assert [j.args["name"] for j in jobs] == ["new"]  # the duplicate is skipped, edge and all
    assert await conn.fetchval("SELECT array_agg(child_id) FROM awa.job_dependencies") \
        == [jobs[0].id]
    assert await _edges(conn, taken.id) == []
    before = await _counts(conn)
    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            parent = await tx.insert(Work("p"))  # a parent of this very transaction
            kids = await tx.insert_many([Work("k1"), Work("k2")], after=[parent])
            assert [k.state for k in kids] == [S.Scheduled, S.Scheduled]
            raise RuntimeError("the application's own write failed")
    assert await _counts(conn) == before


async def test_bulk_parent_lock_keeps_an_edge_from_being_missed(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """A parent finishing while a batch naming it is being inserted waits for the
    batch to commit, then releases every child of it."""
    async def two_children(tx: awa.Transaction, parent: awa.Job) -> list[int]:
        return [k.id for k in await tx.insert_many([Work("c1"), Work("c2")], after=[parent])]

    kids = await insert_while_parent_finishes(client, conn, database_url, two_children)
    assert [await _state(client, k) for k in kids] == [S.Available, S.Available]


def test_sync_bulk_after(sync_client: awa.Client) -> None:
    parent = sync_client.insert(Work("p"))
    kids = sync_client.insert_many_copy([Work("a"), Work("b")], after=[parent])
    assert [k.state for k in kids] == [S.Scheduled, S.Scheduled]
    assert sync_client.enqueue_many_copy([Work("c")], after=[parent.id]) == 1
    with sync_client.transaction() as tx:
        more = tx.insert_many([Work("d")], after=[parent])
    assert [n.id for n in sync_client.workflow(parent.id).nodes][-1] == more[0].id
    assert len(sync_client.workflow(parent.id).nodes) == 5


# -- workflows after existing jobs ---------------------------------------------------------


async def test_workflow_waits_for_existing_jobs(client: awa.AsyncClient,
                                                conn: asyncpg.Connection) -> None:
    x = await client.insert(Work("x"))
    y = await client.insert(Work("y"))
    run = await client.enqueue_workflow(
        chain(group(Work("a"), step(Work("b"), on_parent_failure="run_anyway")), Work("c")),
        after=[x, y.id])
    a, b, c = run.jobs
    assert [j.state for j in run.jobs] == [S.Scheduled] * 3
    assert await _edges(conn, a.id) == [(x.id, None), (y.id, None)]
    assert await _edges(conn, b.id) == [(x.id, None), (y.id, None)]
    assert await _edges(conn, c.id) == [(a.id, None), (b.id, None)]  # inside: unchanged
    assert (await client.get_job(x.id)).metadata == {"_awa_dependents": True}
    await _finish(conn, x.id)
    assert await _state(client, a.id) is S.Scheduled
    await _finish(conn, y.id, "cancelled")
    # a (policy cancel) is cancelled, b (run_anyway) runs; c waits for both: cancelled.
    assert [await _state(client, j.id) for j in run.jobs] == [S.Cancelled, S.Available,
                                                               S.Cancelled]
    graph = await client.workflow(c.id)
    assert {n.id for n in graph.nodes} == {x.id, y.id, a.id, b.id, c.id}


async def test_workflow_after_finished_jobs(client: awa.AsyncClient,
                                            conn: asyncpg.Connection) -> None:
    done = await client.insert(Work("done"))
    failed = await client.insert(Work("failed"))
    await _finish(conn, done.id)
    await _finish(conn, failed.id, "failed")
    run = await client.enqueue_workflow(chain(Work("a"), Work("b")), after=[done])
    assert [j.state for j in run.jobs] == [S.Available, S.Scheduled]
    # A failed parent applies at once, down the workflow (the returned jobs say so).
    run = await client.enqueue_workflow(chord([Work("a"), Work("b")], Work("sum")),
                                        after=[done, failed])
    assert [j.state for j in run.jobs] == [S.Cancelled] * 3
    assert run.jobs[2].errors[-1]["error"] == f"parent job {run.jobs[0].id} cancelled"
    run = await client.enqueue_workflow(
        chain(step(Work("a"), on_parent_failure="run_anyway"), Work("b")), after=[failed])
    assert [j.state for j in run.jobs] == [S.Available, S.Scheduled]
    # "discard" with a parent already failed: nothing to keep, the workflow is refused
    # whole, at its first jobs or further down.
    before = await _counts(conn)
    for flow in (chain(step(Work("a"), on_parent_failure="discard"), Work("b")),
                 chain(Work("a"), step(Work("b"), on_parent_failure="discard"))):
        with pytest.raises(awa.ValidationError) as err:
            await client.enqueue_workflow(flow, after=[failed])
        assert err.value.field == "after"
    assert await _counts(conn) == before


async def test_workflow_after_refusals_write_nothing(client: awa.AsyncClient,
                                                     conn: asyncpg.Connection) -> None:
    a = await client.insert(Work("a"))
    before = await _counts(conn)
    for after in ([a.id, 10_000_000], [], "1", [0]):
        with pytest.raises(awa.ValidationError) as err:
            await client.enqueue_workflow(chain(Work("b"), Work("c")), after=after)  # type: ignore[arg-type]
        assert err.value.field == "after"
    assert await _counts(conn) == before
    assert (await client.get_job(a.id)).metadata == {}  # the lock's mark rolled back too


async def test_workflow_after_in_a_transaction_and_sync(client: awa.AsyncClient,
                                                        conn: asyncpg.Connection,
                                                        database_url: str) -> None:
    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            parent = await tx.insert(Work("p"))
            run = await tx.enqueue_workflow(chain(Work("a"), Work("b")), after=[parent])
            assert await _edges(tx.connection, run.jobs[0].id) == [(parent.id, None)]
            raise RuntimeError("rolled back")
    assert await _counts(conn) == (0, 0)

    def sync_part() -> list[int]:
        with awa.Client(database_url) as sync:
            p = sync.insert(Work("p"))
            with sync.transaction() as tx:
                first = tx.enqueue_workflow(group(Work("a"), Work("b")), after=[p])
            second = sync.enqueue_workflow(chain(Work("c")), after=[p])
            return [p.id, *(j.id for j in first.jobs), second.jobs[0].id]

    p, *kids = await asyncio.to_thread(sync_part)
    for kid in kids:
        assert await _edges(conn, kid) == [(p, None)]
