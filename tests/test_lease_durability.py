"""Run leases are fencing tokens: every statement that hands one out commits
durably (issue 40). A claim committed with ``synchronous_commit = off`` and
forgotten in a server crash handed the same lease out again, so the dead
attempt's writes passed for the live one's. The crash itself is exercised by
the chaos suite (tests/chaos, ``pg_restart_drain``: no (job, lease) pair may
start twice); here, that no claim statement turns durability off."""

from __future__ import annotations

import re
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import TO_MUTABLE

import awa
from awa.db.queries import queries


@dataclass
class Work:
    n: int


#: Every statement that sets a new run lease (the claims, plain, keyed, and the
#: testing harness's), with its arguments after the queue name.
CLAIMS = {
    "attempt_claim": ("default", 4, 0.0, 0.0),
    "attempt_claim_mutable": ("default", 4, 0.0, 0.0),
    "attempt_claim_keyed_only": ("keyed", 4, 0.0, 0.0, ""),
    "attempt_claim_keyed_chunk": ("keyed", 4, 0.0, 0.0, ""),
    "attempt_claim_keyed": ("keyed", 4, 0.0, 0.0, "", 500),
    "attempt_claim_keyed_ring": ("default", 4, 0.0, 0.0),
    "attempt_claim_one_kind": ("default", "work"),
}
#: The claims that read awa.jobs alone: where the ring is off and has never held a
#: job (awa.db.lanes), and the testing harness's (which moves its job there first).
MUTABLE_ONLY = {"attempt_claim_mutable", "attempt_claim_one_kind"}


def test_the_claims_are_every_statement_that_advances_a_lease() -> None:
    q = queries()
    # A lease advances in the statement itself, or in awa.claim (migration 0020).
    advancing = {n for n in q.names() if re.search(r"run_lease\s*=\s*\w+\.run_lease\s*\+"
                                                    r"|awa\.claim\(", q[n])}
    assert advancing == set(CLAIMS)


def test_no_statement_turns_synchronous_commit_off() -> None:
    q = queries()
    off = re.compile(r"set_config\(\s*'synchronous_commit'\s*,\s*'(?!on')", re.I)
    assert [n for n in q.names() if off.search(q[n])] == []


@pytest.mark.parametrize("session", ["on", "off"])
async def test_every_claim_commits_synchronously(client: awa.AsyncClient,
                                                 conn: asyncpg.Connection, session: str) -> None:
    """Each claim, run in a transaction of its own, commits with synchronous_commit
    on, even where the session (or the server, or the role) turned it off, and
    the lease it hands out is one more than the last."""
    q = queries()
    await conn.execute("SELECT set_config('synchronous_commit', $1, false)", session)
    for name, args in CLAIMS.items():
        if args[0] == "keyed":
            job = await client.insert(Work(0), queue="keyed", concurrency_key="k")
        else:
            job = await client.insert(Work(0))
        if name in MUTABLE_ONLY:  # it claims from awa.jobs alone: the job must be there
            await conn.execute(TO_MUTABLE, job.id)
        async with conn.transaction():
            rows = await conn.fetch(q[name], *args)
            assert await conn.fetchval("SHOW synchronous_commit") == "on", name
        assert await conn.fetchval("SHOW synchronous_commit") == session, name
        claimed = [r for r in rows if r["id"] is not None]
        assert [(r["id"], r["run_lease"]) for r in claimed] == [(job.id, 1)], name
        await conn.execute("DELETE FROM awa.jobs WHERE id = $1", job.id)
