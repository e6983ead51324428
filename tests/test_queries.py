"""Named SQL: every statement loads, shared fragments expand, unknown ones are refused."""

from __future__ import annotations

import asyncpg
import pytest

from awa.db import queries as queries_module
from awa.db.queries import Queries

#: Statements over a temporary table that the session creates first.
SESSION_ONLY = {"job_insert_from_staging", "dependency_insert_from_staging",
                "dependency_count_from_staging"}


def test_fragments_expand_into_every_statement_that_includes_them() -> None:
    q = Queries()
    assert all("{{" not in q[name] for name in q.names())
    revivers = [n for n in q.names() if "FROM moved ORDER BY id" in q[n]
                and "'available', priority, 0" in q[n]]
    assert set(revivers) >= {"job_retry_finished", "job_retry_failed_bulk",
                             "bulk_failed_retry_chunk", "bulk_dlq_retry_chunk"}
    assert "revive_moved" not in q.names()  # a fragment is not a statement
    assert '"other".jobs' in Queries("other")["job_retry_finished"]


def test_unknown_fragment_is_refused() -> None:
    blocks = queries_module._parse("-- name: a\nSELECT {{missing}}\n")
    assert blocks == [("name", "a", "SELECT {{missing}}")]
    with pytest.raises(RuntimeError, match="unknown fragment"):
        queries_module._expand("a", blocks[0][2], {})


async def test_every_statement_is_valid_sql(conn: asyncpg.Connection) -> None:
    """Each named statement prepares against the migrated schema (nothing runs)."""
    q = Queries()
    bad = []
    for name in sorted(set(q.names()) - SESSION_ONLY):
        sql = q[name]
        if sql.lstrip().upper().startswith(("VACUUM", "BEGIN", "COMMIT", "SET", "LISTEN")) \
                or ";" in sql.rstrip().rstrip(";"):
            continue  # not preparable: utility or multi-statement
        try:
            await conn.prepare(sql)
        except asyncpg.PostgresError as exc:
            bad.append(f"{name}: {exc}")
    assert bad == []
