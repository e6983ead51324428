"""Claimed rows are decoded by column name, in one place (`awa.core.model.ClaimDecoder`)."""

from __future__ import annotations

import asyncpg
import pytest

from awa.core.model import CLAIM_COLUMNS, KEY_COLUMNS, ClaimDecoder, Job
from awa.core.states import JobState

#: A claimed row's values as SQL, by column (a due job on its first attempt, keyed).
VALUES = {
    "id": "7::bigint", "kind": "'k'", "queue": "'q'", "args": "'{\"a\": 1}'::jsonb",
    "priority": "2::smallint", "attempt": "1::smallint", "max_attempts": "25::smallint",
    "run_lease": "3::bigint", "run_at": "1700000000.5::float8",
    "created_at": "1700000000.25::float8", "attempted_at": "1700000001::float8",
    "deadline_at": "1700000031::float8", "tags": "ARRAY['t']", "metadata": "NULL::jsonb",
    "errors": "NULL::jsonb", "progress": "NULL::jsonb", "unique_key": "NULL::bytea",
    "ordering_key": "'o'", "concurrency_key": "'ck'", "concurrency_limit": "2",
    "concurrency_slot": "1",
}


async def _row(conn: asyncpg.Connection, columns: list[str]) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT " + ", ".join(f"{VALUES[c]} AS {c}" for c in columns))
    assert row is not None
    return row


def test_the_columns_are_the_claim_statements() -> None:
    assert set(CLAIM_COLUMNS) | set(KEY_COLUMNS) == set(VALUES)
    assert len(set(CLAIM_COLUMNS)) == len(CLAIM_COLUMNS)


async def test_a_row_decodes_the_same_whatever_its_column_order(
        conn: asyncpg.Connection) -> None:
    plain = list(CLAIM_COLUMNS)
    job = ClaimDecoder(plain)(await _row(conn, plain))
    assert (job.id, job.kind, job.queue, job.args, job.priority, job.attempt,
            job.max_attempts, job.run_lease, job.tags, job.ordering_key) == \
        (7, "k", "q", {"a": 1}, 2, 1, 25, 3, ["t"], "o")
    assert job.state is JobState.Running and job.metadata == {} and job.errors == []
    assert job.run_at_datetime.timestamp() == 1700000000.5
    assert job.created_at_datetime.timestamp() == 1700000000.25
    assert job.heartbeat_at == job.attempted_at and job.deadline is not None
    assert job.concurrency_key is None
    # Reordered, or with more columns around them: the same job.
    shuffled = plain[::-1]
    assert ClaimDecoder(shuffled)(await _row(conn, shuffled)) == job
    assert Job.from_claim(await _row(conn, shuffled)) == job
    # Keyed, with the key columns after them (as the keyed claims) or anywhere.
    for columns in (plain + list(KEY_COLUMNS), list(KEY_COLUMNS) + shuffled):
        keyed = ClaimDecoder(columns, keyed=True)(await _row(conn, columns))
        assert (keyed.concurrency_key, keyed.concurrency_limit, keyed.concurrency_slot) == \
            ("ck", 2, 1)
        keyed.concurrency_key = keyed.concurrency_limit = keyed.concurrency_slot = None
        assert keyed == job
        assert Job.from_claim(await _row(conn, columns)).concurrency_slot == 1


@pytest.mark.parametrize("missing", ["run_lease", "ordering_key", "concurrency_slot"])
async def test_a_missing_column_is_named(conn: asyncpg.Connection, missing: str) -> None:
    columns = [c for c in (*CLAIM_COLUMNS, *KEY_COLUMNS) if c != missing]
    row = await _row(conn, columns)
    with pytest.raises(LookupError, match=f"no column '{missing}'"):
        ClaimDecoder(row.keys(), keyed=True)
    if missing != "concurrency_slot":
        with pytest.raises(LookupError, match=f"no column '{missing}'"):
            Job.from_claim(row)
