"""Leadership and presence as append-only records (migration 0028, issue 42).

The lease and each worker's presence are rows that are only ever inserted;
the spent partition of each is emptied by TRUNCATE, which a held xmin horizon
does not hold back. Workers of the release before 0028 (awa.leader,
awa.runtime_instances) keep one leader with this release's during a rolling
upgrade.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import asyncpg
import pytest

from awa.db.queries import Queries

TTL = timedelta(seconds=10)
#: The previous release's lease statement (before 0028), as its workers run it.
OLD_TAKE = """
INSERT INTO awa.leader AS l (singleton, holder, expires_at)
VALUES (true, $1, now() + $2::interval)
ON CONFLICT (singleton) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
RETURNING holder"""


async def _written(conn: asyncpg.Connection, family: str) -> tuple[int, int]:
    """Rows inserted into, and rows updated or deleted in, ``family``'s partitions
    by this session."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    row = await conn.fetchrow(
        "SELECT coalesce(sum(n_tup_ins), 0)::int AS ins, "
        "coalesce(sum(n_tup_upd + n_tup_del), 0)::int AS changed "
        "FROM pg_stat_user_tables WHERE schemaname = 'awa' AND relname LIKE $1 || '\\_%'",
        family)
    assert row is not None
    return row["ins"], row["changed"]


async def _holder(conn: asyncpg.Connection) -> str | None:
    value = await conn.fetchval("SELECT holder FROM awa.leadership WHERE expires_at >= now()")
    return None if value is None else str(value)


async def _clear_of_block_edge(conn: asyncpg.Connection) -> None:
    """Wait out the last seconds of a ten-minute block, so a test's rows and its
    tidy see the same block."""
    left = await conn.fetchval("SELECT 600 - extract(epoch FROM now())::numeric % 600")
    if left < 20:
        await asyncio.sleep(float(left) + 1)


async def test_the_lease_is_taken_renewed_and_given_up_by_appending_terms(
        conn: asyncpg.Connection) -> None:
    q = Queries()
    take, resign = q["leader_acquire"], q["leader_release"]
    assert await conn.fetchval(take, "a", TTL) is True
    assert await conn.fetchval(take, "b", TTL) is False  # a holds a live lease
    for _ in range(3):
        assert await conn.fetchval(take, "a", TTL) is True  # renewals
    assert await _holder(conn) == "a"
    await conn.execute(resign, "b")  # not the holder: nothing happens
    assert await _holder(conn) == "a"
    await conn.execute(resign, "a")
    assert await _holder(conn) is None
    assert await conn.fetchval(take, "b", TTL) is True  # at once, not after the lease
    assert await _holder(conn) == "b"

    # Four takes, a resignation, a take: six rows, none ever changed; the
    # previous release's row is never written when none of its workers is alive.
    assert await _written(conn, "leader_terms") == (6, 0)
    assert await conn.fetchval("SELECT count(*) FROM awa.leader") == 0


async def test_an_expired_lease_passes_to_the_next_taker_and_takers_queue(
        conn: asyncpg.Connection, database_url: str) -> None:
    q = Queries()
    assert await conn.fetchval(q["leader_acquire"], "a", timedelta(milliseconds=200)) is True
    await asyncio.sleep(0.3)
    assert await _holder(conn) is None
    # Eight processes asking at once after the expiry: exactly one wins.
    conns = [await asyncpg.connect(database_url) for _ in range(8)]
    try:
        won = await asyncio.gather(*(c.fetchval(q["leader_acquire"], f"p{i}", TTL)
                                     for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    assert sorted(won) == [False] * 7 + [True]
    assert await _holder(conn) == f"p{won.index(True)}"
    assert await conn.fetchval("SELECT count(DISTINCT n) = count(*) FROM awa.leader_terms")


async def test_one_leader_with_workers_of_the_previous_release(conn: asyncpg.Connection) -> None:
    q = Queries()
    take = q["leader_acquire"]
    # An old worker is alive (its presence row) and leads (its lease row).
    await conn.execute("INSERT INTO awa.runtime_instances (instance_id, hostname, pid, version, "
                       "started_at, last_seen_at) VALUES ('old', 'h', 1, '0.0', now(), now())")
    assert await conn.fetchval(OLD_TAKE, "old", TTL) == "old"
    assert await conn.fetchval(take, "new", TTL) is False
    assert await _holder(conn) == "old"

    # Its lease runs out: the new worker leads, and holds the old lease too, so
    # the old workers do not elect a second leader.
    await conn.execute("UPDATE awa.leader SET expires_at = now() - interval '1 s'")
    assert await conn.fetchval(take, "new", TTL) is True
    assert await conn.fetchval("SELECT holder FROM awa.leader") == "new"
    assert await conn.fetchval(OLD_TAKE, "old", TTL) is None
    assert await _holder(conn) == "new"

    # The old workers are gone: the old row is no longer written.
    await conn.execute("DELETE FROM awa.runtime_instances")
    before = await conn.fetchval("SELECT (xmin::text, expires_at) FROM awa.leader")
    assert await conn.fetchval(take, "new", TTL) is True
    assert await conn.fetchval("SELECT (xmin::text, expires_at) FROM awa.leader") == before
    await conn.execute(q["leader_release"], "new")
    assert await conn.fetchval("SELECT count(*) FROM awa.leader") == 0
    assert await _holder(conn) is None


async def test_presence_is_each_process_latest_row_until_it_says_goodbye(
        conn: asyncpg.Connection) -> None:
    q = Queries()

    async def beat(instance: str, in_flight: int) -> None:
        await conn.execute(q["presence_beat"], instance, "host", 7, "1.0", started, False, True,
                           in_flight, 10 * in_flight, 5, json.dumps({"q": {"max_workers": 2}}))

    started = await conn.fetchval("SELECT now()")
    for n in range(3):
        await beat("w1", n)
        await beat("w2", 10 + n)
    await conn.execute("INSERT INTO awa.runtime_instances (instance_id, hostname, pid, version, "
                       "started_at, last_seen_at) VALUES ('old', 'h', 1, '0.0', now(), now())")
    rows = {r["instance_id"]: r for r in await conn.fetch("SELECT * FROM awa.presence")}
    assert sorted(rows) == ["old", "w1", "w2"]
    assert (rows["w1"]["in_flight"], rows["w2"]["in_flight"]) == (2, 12)
    assert rows["w2"]["claimed"] == 120 and rows["w1"]["listening"] is True
    assert rows["w1"]["queues"] == {"q": {"max_workers": 2}}
    assert await conn.fetchval(q["queue_known"], "q") is True

    await conn.execute(q["presence_remove"], "w1", "host", 7, "1.0", started)
    assert sorted(await conn.fetchval("SELECT array_agg(instance_id) FROM awa.presence")) \
        == ["old", "w2"]
    assert await _written(conn, "presence_beats") == (7, 0)


async def test_a_spent_partition_is_truncated_at_once_or_left_for_later(
        conn: asyncpg.Connection, database_url: str) -> None:
    await _clear_of_block_edge(conn)
    spent = await conn.fetchval("SELECT (awa.rotation_part() + 1) % 3")
    current = await conn.fetchval("SELECT awa.rotation_part()")

    async def old_rows() -> None:
        await conn.execute(
            "INSERT INTO awa.presence_beats (part, instance_id, hostname, pid, version, "
            "started_at, seen_at) SELECT $1, 'w' || i, 'h', i, '1', now(), "
            "now() - interval '25 minutes' FROM generate_series(1, 100) i", spent)
        await conn.execute("INSERT INTO awa.leader_terms (part, n, holder, expires_at) "
                           "VALUES ($1, 1, 'a', now() - interval '25 minutes')", spent)

    async def tidy(family: str) -> bool:
        return bool(await conn.fetchval("SELECT awa.rotation_tidy($1)", family))

    counts = {"presence_beats": "SELECT count(*) FROM awa.presence_beats WHERE part = $1",
              "leader_terms": "SELECT count(*) FROM awa.leader_terms WHERE part = $1"}

    async def count(family: str, part: int) -> int:
        return int(await conn.fetchval(counts[family], part))

    await old_rows()
    await conn.execute(Queries()["presence_beat"], "live", "h", 1, "1", await conn.fetchval(
        "SELECT now()"), False, True, 0, 0, 0, "{}")
    horizon = await asyncpg.connect(database_url)
    reader = await asyncpg.connect(database_url)
    try:
        # A horizon held throughout, and a reader holding the presence partitions.
        await horizon.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await horizon.fetchval("SELECT count(*) FROM awa.jobs")
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM awa.presence")
        await conn.execute("SET statement_timeout = '5s'")
        assert await tidy("presence_beats") is False  # did not wait for the reader
        assert await count("presence_beats", spent) == 100
        await reader.execute("COMMIT")

        assert await tidy("presence_beats") is True
        assert await tidy("leader_terms") is True
        assert await count("presence_beats", spent) == 0
        assert await count("leader_terms", spent) == 0
        assert await count("presence_beats", current) == 1  # the current block is kept
        assert await tidy("presence_beats") is False  # nothing left to do

        # Not truncated: a lease still live (longer than a block) or a row
        # written across a block's edge.
        await conn.execute("INSERT INTO awa.leader_terms (part, n, holder, expires_at) "
                           "VALUES ($1, 2, 'a', now() + interval '1 hour')", spent)
        assert await tidy("leader_terms") is False
        await conn.execute(
            "INSERT INTO awa.presence_beats (part, instance_id, hostname, pid, version, "
            "started_at) VALUES ($1, 'edge', 'h', 1, '1', now())", spent)
        assert await tidy("presence_beats") is False
        assert await count("presence_beats", spent) == 1
    finally:
        await horizon.close()
        await reader.close()
    await conn.execute("SELECT pg_stat_force_next_flush()")
    dead = await conn.fetchval("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
                               "WHERE schemaname = 'awa' AND (relname LIKE 'presence\\_beats%' "
                               "OR relname LIKE 'leader\\_terms%')")
    assert dead == 0
    with pytest.raises(asyncpg.RaiseError, match="no such rotating table"):
        await tidy("jobs")
