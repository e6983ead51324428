"""The keyed claim statement itself (``attempt_claim_keyed``): which slots it
grants, how it spreads a batch over keys, and that its plan stays cheap enough
that PostgreSQL never JIT-compiles it (docs/guide/concurrency-keys.md, "Cost").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg

import awa
from awa.db.queries import queries
from awa.worker.keyed import KeyedClaims

Q = "default"


@dataclass
class Work:
    n: int


async def _claim(conn: asyncpg.Connection, want: int, cursor: str = "") -> list[asyncpg.Record]:
    rows = await conn.fetch(queries()["attempt_claim_keyed"], Q, want, 0.0, 0.0, cursor, 500)
    return rows


def _n(args: object) -> int:
    return int((args if isinstance(args, dict) else json.loads(str(args)))["n"])


def _slots(rows: list[asyncpg.Record]) -> list[int]:
    return sorted(r["concurrency_slot"] for r in rows if r["id"] is not None)


async def test_claim_fills_the_lowest_free_slots(client: awa.AsyncClient,
                                                 conn: asyncpg.Connection) -> None:
    """Slots freed in the middle are granted again, lowest first, and never more
    than the key's free slots, however many jobs wait."""
    await client.enqueue_many_copy([Work(i) for i in range(20)], concurrency_key="k",
                                   max_in_flight=5)
    assert _slots(await _claim(conn, 10)) == [1, 2, 3, 4, 5]
    # Two jobs finish (their rows leave awa.jobs, as a completion moves them out).
    await conn.execute("DELETE FROM awa.jobs WHERE concurrency_slot IN (2, 4)")
    assert _slots(await _claim(conn, 10)) == [2, 4]
    assert _slots(await _claim(conn, 10)) == []
    running = await conn.fetchval("SELECT array_agg(concurrency_slot ORDER BY concurrency_slot)"
                                  " FROM awa.jobs WHERE state = 'running'")
    assert list(running) == [1, 2, 3, 4, 5]


async def test_claim_spreads_a_batch_over_small_keys_in_turn(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    """Keys with fewer jobs than the batch: one claim takes them key after key
    (each job the oldest of its key) until the batch is full, and the next claim
    goes on from the key where it stopped."""
    await client.enqueue_many_copy([Work(i) for i in range(100)],
                                   opts=[{"concurrency_key": f"k{i % 50:02d}",
                                          "max_in_flight": 10} for i in range(100)])
    rows = await _claim(conn, 40)
    keys = sorted({r["concurrency_key"] for r in rows})
    assert len(rows) == 40 and keys == [f"k{i:02d}" for i in range(20)]
    assert _slots(rows) == sorted([1, 2] * 20)
    cursor = rows[-1]["cursor"]
    assert cursor == "k19"
    rows = await _claim(conn, 40, cursor)
    assert sorted({r["concurrency_key"] for r in rows}) == [f"k{i:02d}" for i in range(20, 40)]


async def test_claim_after_claims_takes_the_next_jobs_of_a_key(client: awa.AsyncClient,
                                                               conn: asyncpg.Connection) -> None:
    """The count and the claim of a key start at its first available job: jobs
    claimed a moment before (still in the index) are neither counted nor lost,
    and a key's jobs go in priority, then age order across claims."""
    await client.enqueue_many_copy([Work(i) for i in range(30)], concurrency_key="k",
                                   max_in_flight=100, priority=3)
    await client.enqueue_many_copy([Work(i) for i in range(5)], concurrency_key="k",
                                   max_in_flight=100, priority=1)
    seen: list[int] = []
    for _ in range(5):
        # A claim returns its jobs in no particular order; the worker runs them by
        # priority. Across claims, each takes the best of what is left.
        rows = sorted((r for r in await _claim(conn, 7) if r["id"] is not None),
                      key=lambda r: (r["priority"], r["id"]))
        assert len(rows) == 7
        seen += [_n(r["args"]) for r in rows]
    assert seen[:5] == [0, 1, 2, 3, 4] and seen[5:] == list(range(30))
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'available'") == 0


async def test_claim_plan_stays_below_the_jit_threshold(client: awa.AsyncClient,
                                                        conn: asyncpg.Connection) -> None:
    """With a backlog of one key, the planner's cost for the claim must stay under
    jit_above_cost: above it, a connection with JIT on (anything behind a pooler,
    where Awa cannot turn JIT off) compiled the claim for a second or two on
    every run. The estimate once was ~800,000 at 20,000 jobs (and ~90,000 in a
    draft that left the rows of its per-key LIMITs to the planner's guess)."""
    await client.enqueue_many_copy([Work(i) for i in range(20000)], concurrency_key="one",
                                   max_in_flight=1000)
    await _claim(conn, 32)  # some jobs in flight, as in a drain
    await conn.execute("ANALYZE awa.jobs")
    threshold = float(await conn.fetchval("SELECT current_setting('jit_above_cost')"))
    await conn.execute("PREPARE keyed_claim(text, integer, float8, float8, text, integer) AS "
                       + queries()["attempt_claim_keyed"])
    await conn.execute("PREPARE keyed_chunk(text, integer, float8, float8, text) AS "
                       + queries()["attempt_claim_keyed_chunk"])
    await conn.execute("PREPARE keyed_only(text, integer, float8, float8, text) AS "
                       + queries()["attempt_claim_keyed_only"])
    for mode in ("force_generic_plan", "force_custom_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for run in ("keyed_claim('default', 32, 0, 0, 'one', 500)",
                    "keyed_chunk('default', 32, 0, 0, 'one')",
                    "keyed_only('default', 32, 0, 0, 'one')"):
            plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {run}")
            cost = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Total Cost"]
            # A quarter of the threshold: headroom for a backlog several times
            # larger (the estimate grows with the table).
            assert cost < threshold / 4, (mode, run, cost)


async def test_chunk_claim_grants_slots_and_asks_for_the_walk(client: awa.AsyncClient,
                                                              conn: asyncpg.Connection) -> None:
    """The small statement (one range scan, no walk): keys of the scan get
    their lowest free slots; when the scan is full but its keys are at their
    limit it claims what it can and says so (`walk`), and the worker's claim
    then takes the rest from the keys after it."""
    await client.enqueue_many_copy([Work(i) for i in range(20)], concurrency_key="a-hot",
                                   max_in_flight=2)
    await client.enqueue_many_copy([Work(i) for i in range(5)],
                                   opts=[{"concurrency_key": f"b{i}"} for i in range(5)])
    sql = queries()["attempt_claim_keyed_chunk"]
    rows = await conn.fetch(sql, Q, 8, 0.0, 0.0, "")
    assert [(r["concurrency_key"], r["concurrency_slot"]) for r in rows] == [
        ("a-hot", 1), ("a-hot", 2)]
    assert rows[-1]["cursor"] == "a-hot" and rows[-1]["walk"]
    rows = await conn.fetch(sql, Q, 4, 0.0, 0.0, "a-hot")  # the next keys fill it
    assert sorted(r["concurrency_key"] for r in rows) == [f"b{i}" for i in range(4)]
    assert rows[-1]["cursor"] == "b3" and not rows[-1]["walk"]
    rows = await conn.fetch(sql, Q, 8, 0.0, 0.0, "b3")  # b4, then round to a-hot again
    assert [r["concurrency_key"] for r in rows] == ["b4"] and rows[-1]["walk"]
    # Only a-hot left, at its limit: nothing claimed, and no row at all (the
    # worker's claim then walks on), from either statement.
    assert await conn.fetch(sql, Q, 8, 0.0, 0.0, "b4") == []
    assert await conn.fetch(queries()["attempt_claim_keyed_only"], Q, 8, 0.0, 0.0, "b4") == []
    # The worker's claim: the chunk, then (a-hot at its limit) the walk for the rest.
    await conn.execute("DELETE FROM awa.jobs WHERE state = 'running'")
    await client.enqueue_many_copy([Work(i) for i in range(3)],
                                   opts=[{"concurrency_key": f"c{i}"} for i in range(3)])
    claims = KeyedClaims(queries(), configured=True)
    got = await claims.claim(conn, Q, 8, 0.0, 0.0)
    assert sorted(r["concurrency_key"] for r in got) == ["a-hot", "a-hot", "c0", "c1", "c2"]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'running' "
                               "AND concurrency_key = 'a-hot'") == 2


async def test_claim_walks_on_past_a_saturated_key_and_wraps(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    """A key at its limit whose backlog fills the first range the claim reads
    gives nothing, and the claim goes on key by key to fill the batch; the next
    claim goes on after where it stopped, wraps round to the first key, and
    stops before the keys it began with."""
    await client.enqueue_many_copy([Work(i) for i in range(100)], concurrency_key="a-hot",
                                   max_in_flight=1)
    await client.enqueue_many_copy([Work(i) for i in range(10)],
                                   opts=[{"concurrency_key": f"b{i}"} for i in range(10)])
    rows = await _claim(conn, 8)
    assert sorted(r["concurrency_key"] for r in rows) == ["a-hot"] + [f"b{i}" for i in range(7)]
    assert rows[-1]["cursor"] == "b6"
    rows = [r for r in await _claim(conn, 8, "b6") if r["id"] is not None]
    assert sorted(r["concurrency_key"] for r in rows) == ["b7", "b8", "b9"]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'running' "
                               "AND concurrency_key = 'a-hot'") == 1


async def test_keyed_only_claim_turns_to_unkeyed_jobs_when_it_finds_them(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """While the last claim found no unkeyed job, the worker's claim runs the
    statement without the unkeyed scans (``attempt_claim_keyed_only``). Unkeyed
    jobs that arrive are still claimed: in the same claim when the keyed jobs
    leave room (the walk takes them), else by the next claim, which looks for
    both again; once none is left the claim goes back to keyed jobs only."""
    claims = KeyedClaims(queries(), configured=True)
    await client.enqueue_many_copy([Work(i) for i in range(4)], concurrency_key="k",
                                   max_in_flight=100)
    got = await claims.claim(conn, Q, 8, 0.0, 0.0)
    assert [r["concurrency_key"] for r in got] == ["k"] * 4 and not claims.mixed
    # Unkeyed jobs arrive; the keyed-only claim leaves room: the same claim takes them.
    await client.enqueue_many_copy([Work(i) for i in range(3)])
    await client.enqueue_many_copy([Work(i) for i in range(2)], concurrency_key="k",
                                   max_in_flight=100)
    got = await claims.claim(conn, Q, 8, 0.0, 0.0)
    assert sorted((r["concurrency_key"] or "") for r in got) == ["", "", "", "k", "k"]
    assert claims.mixed  # the walk claimed unkeyed jobs
    # A batch full of keyed jobs: the unkeyed ones wait for the next claim, no longer.
    await client.enqueue_many_copy([Work(i) for i in range(6)], concurrency_key="k",
                                   max_in_flight=100)
    await client.enqueue_many_copy([Work(i) for i in range(2)])
    claims.mixed = False
    got = await claims.claim(conn, Q, 4, 0.0, 0.0)
    assert [r["concurrency_key"] for r in got] == ["k"] * 4 and claims.mixed
    got = await claims.claim(conn, Q, 8, 0.0, 0.0)
    assert sorted((r["concurrency_key"] or "") for r in got) == ["", "", "k", "k"]
    await client.enqueue_many_copy([Work(i) for i in range(2)], concurrency_key="k",
                                   max_in_flight=100)
    got = await claims.claim(conn, Q, 8, 0.0, 0.0)  # no unkeyed job left: keyed only again
    assert [r["concurrency_key"] for r in got] == ["k"] * 2 and not claims.mixed
