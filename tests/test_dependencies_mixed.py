"""Bulk calls where only some jobs name after=.

Up to `ONE_STATEMENT_MAX` jobs, `insert_many`, `tx.insert_many` and
`enqueue_many_copy` send the whole call as one statement (no staging table),
as `insert_many` does without after=; beyond, `enqueue_many_copy` COPYs the
jobs without parents straight into the jobs table and stages only those that
wait. Either way, in one transaction: every
job once, in the call's order (ids included), edges only for the jobs that
asked, nothing at all when any part fails.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from tests.test_dependencies import S, Work, _edges, _finish

import awa

#: ``_big``: more than `ONE_STATEMENT_MAX` jobs (insert_many stages them all;
#: enqueue_many_copy COPYs those without parents into the jobs table).
PATHS = ["insert_many", "insert_many_big", "insert_many_copy", "enqueue_many_copy",
         "enqueue_many_copy_big", "tx.insert_many"]


async def _call(client: awa.AsyncClient, path: str, jobs: list[Work],
                opts: list[dict[str, Any] | None]) -> list[awa.Job] | int:
    if path in ("insert_many", "insert_many_big"):
        return await client.insert_many(jobs, opts=opts)
    if path == "insert_many_copy":
        return await client.insert_many_copy(jobs, opts=opts)
    if path in ("enqueue_many_copy", "enqueue_many_copy_big"):
        return await client.enqueue_many_copy(jobs, opts=opts)
    async with client.transaction() as tx:
        return await tx.insert_many(jobs, opts=opts)


def _batch(path: str, waits: dict[int, dict[str, Any]]) -> tuple[list[Work], list[Any]]:
    """Jobs p0, p1, ... with ``waits[i]`` as job i's opts (1,010 of them for a
    ``_big`` path, else 8)."""
    n = 1_010 if path.endswith("_big") else 8
    return [Work(f"p{i}") for i in range(n)], [waits.get(i) for i in range(n)]


@pytest.mark.parametrize("path", PATHS)
async def test_mixed_bulk_inserts_each_job_once_in_order(
        client: awa.AsyncClient, conn: asyncpg.Connection, path: str) -> None:
    active = await client.insert(Work("active"))
    done = await client.insert(Work("done"))
    await _finish(conn, done.id)
    jobs, opts = _batch(path, {1: {"after": [active]}, 2: {"after": [done]},
                               5: {"after": [active, done], "on_parent_failure": "run_anyway"}})
    result = await _call(client, path, jobs, opts)
    rows = await conn.fetch("SELECT id, args->>'name' AS name, state::text, run_at"
                            " FROM awa.jobs_active WHERE id > $1 ORDER BY id", done.id)
    # Every job exactly once, ids in the call's order.
    assert [r["name"] for r in rows] == [j.name for j in jobs]
    if isinstance(result, int):
        assert result == len(jobs)
    else:
        assert [j.id for j in result] == [r["id"] for r in rows]
        assert [j.state.value for j in result] == [r["state"] for r in rows]
    ids = [r["id"] for r in rows]
    states = [r["state"] for r in rows]
    # Edges only where asked; the finished parent applied at once.
    assert await _edges(conn, ids[1]) == [(active.id, None)]
    assert await _edges(conn, ids[2]) == [(done.id, "completed")]
    assert await _edges(conn, ids[5]) == [(active.id, None), (done.id, "completed")]
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 4
    assert states[1] == states[5] == "scheduled" and rows[1]["run_at"].year == 9999
    assert all(s == "available" for i, s in enumerate(states) if i not in (1, 5))
    await _finish(conn, active.id)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_active WHERE id = ANY($1)"
                               " AND state = 'available'", ids) == len(jobs)


@pytest.mark.parametrize("path", ["insert_many", "insert_many_copy"])
async def test_mixed_bulk_returns_only_what_it_inserted_in_order(
        client: awa.AsyncClient, conn: asyncpg.Connection, path: str) -> None:
    """Jobs skipped for their unique key leave no row and no edge, and the rest
    still come back in the call's order."""
    parent = await client.insert(Work("parent"))
    await client.insert(Work("p1"), unique_opts={"by_args": True})
    await client.insert(Work("p4"), unique_opts={"by_args": True})
    jobs = [Work(f"p{i}") for i in range(6)]
    opts: list[dict[str, Any] | None] = [None] * 6
    opts[3] = {"after": [parent]}
    opts[4] = {"after": [parent]}
    for i in (1, 4):
        opts[i] = {**(opts[i] or {}), "unique_opts": {"by_args": True}}
    method = client.insert_many if path == "insert_many" else client.insert_many_copy
    result = await method(jobs, opts=opts)
    assert [j.args["name"] for j in result] == ["p0", "p2", "p3", "p5"]
    assert [j.id for j in result] == sorted(j.id for j in result)
    assert [j.state for j in result] == [S.Available, S.Available, S.Scheduled, S.Available]
    assert await conn.fetchval("SELECT array_agg(child_id) FROM awa.job_dependencies") \
        == [result[2].id]


async def test_a_small_mixed_batch_is_one_statement(client: awa.AsyncClient) -> None:
    """No staging table for a small batch with after= on some jobs (as for one
    without): none was created in this transaction, per PostgreSQL's counters."""
    parent = await client.insert(Work("parent"))
    jobs, opts = _batch("tx.insert_many", {2: {"after": [parent]}, 6: {"after": [parent]}})
    async with client.transaction() as tx:
        inserted = await tx.insert_many(jobs, opts=opts)
        staged = await tx.fetch_optional("SELECT n_tup_ins FROM pg_stat_xact_user_tables"
                                    " WHERE relname = 'awa_job_staging'")
    assert staged is None
    assert [j.args["name"] for j in inserted] == [j.name for j in jobs]
    assert [j.state for j in inserted].count(S.Scheduled) == 2


@pytest.mark.parametrize("path", PATHS)
async def test_mixed_bulk_is_all_or_nothing(client: awa.AsyncClient, conn: asyncpg.Connection,
                                            path: str) -> None:
    """Refused input writes nothing; a failure after the plain jobs were written
    (here: the edges' insert, made to fail) takes them back too."""
    parent = await client.insert(Work("parent"))
    failed = await client.insert(Work("failed"))
    await _finish(conn, failed.id, "failed")
    before = await conn.fetchval("SELECT count(*) FROM awa.jobs_all")
    bad: list[dict[int, dict[str, Any]]] = [
        {3: {"after": [10_000_000]}},
        {3: {"after": [failed], "on_parent_failure": "discard"}},
        {3: {"after": [parent], "run_at": "2030-01-01T00:00:00+00:00"}},
    ]
    for waits in bad:
        jobs, opts = _batch(path, {1: {"after": [parent]}, **waits})
        with pytest.raises(awa.ValidationError):
            await _call(client, path, jobs, opts)
    await conn.execute("""
        CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'edges refused'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON awa.job_dependencies
            FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse()""")
    jobs, opts = _batch(path, {4: {"after": [parent]}})
    with pytest.raises(awa.DatabaseError, match="edges refused"):
        await _call(client, path, jobs, opts)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == before
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies") == 0
