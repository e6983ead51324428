"""Shared machinery of the property-based tests (hypothesis).

- `prop_settings`: small, derandomized runs in CI; ``AWA_HYPOTHESIS_EXAMPLES=N``
  explores N random examples per property instead (the long mode).
- `LoopThread`: an event loop on its own thread, so hypothesis' synchronous
  drivers (state machines, ``@given``) can await the database.
- `reset`, `rows`, `check_invariants`: a clean slate per example and the
  storage invariants (docs/architecture.md, Tables) checked against the real tables.
- Adversarial value strategies for the bad-input properties.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

import asyncpg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from awa.db.pool import init_connection

T = TypeVar("T")

LONG_EXAMPLES = os.environ.get("AWA_HYPOTHESIS_EXAMPLES")


def prop_settings(ci_examples: int, **extra: Any) -> settings:
    """CI: ``ci_examples`` fixed examples; long mode: ``$AWA_HYPOTHESIS_EXAMPLES`` random ones."""
    long = LONG_EXAMPLES is not None
    return settings(max_examples=int(LONG_EXAMPLES) if long else ci_examples,
                    deadline=None, derandomize=not long, database=None if not long else
                    settings.default.database, print_blob=True,
                    suppress_health_check=list(HealthCheck), **extra)


class LoopThread:
    """Runs coroutines on a private event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="awa-prop-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what is still pending, then stop the loop and its thread."""
        async def cancel_pending() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.run(cancel_pending())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


async def connect(database_url: str) -> asyncpg.Connection:
    """A raw connection with Awa's JSON codecs, for test-side SQL."""
    conn = await asyncpg.connect(database_url)
    await init_connection(conn)
    return conn


RESET_SQL = """
DELETE FROM awa.unique_claims;
DELETE FROM awa.jobs;
DELETE FROM awa.closures;
DELETE FROM awa.heartbeats;
DELETE FROM awa.receipts;
DELETE FROM awa.ready_cancels;
DELETE FROM awa.ready;
DELETE FROM awa.claim_log;
DELETE FROM awa.jobs_done;
DELETE FROM awa.dlq;
DELETE FROM awa.queues;
DELETE FROM awa.cron_jobs;
"""


async def reset(conn: asyncpg.Connection) -> None:
    """Remove every job (of both lanes), claim, queue switch and schedule (a clean
    slate per example)."""
    await conn.execute(RESET_SQL)


#: Active jobs are read through awa.jobs_active: awa.jobs and the append-only
#: lane's available and running jobs (migration 0020; on unless AWA_TEST_RING=0), both
#: tagged 'jobs'. A job is in one of them or the other, never in both.
ROWS_SQL = """
SELECT 'jobs' AS tbl, id, kind, queue, state::text AS state, attempt, max_attempts, run_lease,
       unique_key, unique_states, callback_id, args, metadata, errors, progress,
       finalized_at, priority, tags
FROM awa.jobs_active
UNION ALL
SELECT 'done', id, kind, queue, state::text, attempt, max_attempts, run_lease, unique_key,
       unique_states, callback_id, args, metadata, errors, progress, finalized_at, priority,
       tags
FROM awa.jobs_done
UNION ALL
SELECT 'dlq', id, kind, queue, state::text, attempt, max_attempts, run_lease, unique_key,
       unique_states, callback_id, args, metadata, errors, progress, finalized_at, priority,
       tags
FROM awa.dlq
"""

TABLE_STATES = {
    "jobs": {"scheduled", "available", "running", "retryable", "waiting_external"},
    "done": {"completed", "failed", "cancelled"},
    "dlq": {"failed"},
}
STATE_BITS = {s: 1 << i for i, s in enumerate(
    ("scheduled", "available", "running", "completed", "retryable", "failed", "cancelled",
     "waiting_external"))}


async def rows(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every job row of the three tables (awa.jobs with the ring's active jobs), tagged
    with its table."""
    return [dict(r) for r in await conn.fetch(ROWS_SQL)]


async def counts(conn: asyncpg.Connection) -> tuple[int, ...]:
    """Row counts of the job tables, DLQ, queues, claims and schedules (a write detector)."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM awa.jobs_all), (SELECT count(*) FROM awa.dlq),"
        " (SELECT count(*) FROM awa.queues), (SELECT count(*) FROM awa.unique_claims),"
        " (SELECT count(*) FROM awa.cron_jobs),"
        " (SELECT coalesce(sum(run_lease + attempt), 0) FROM awa.jobs_all)")
    assert row is not None
    return tuple(int(v) for v in row)


async def check_invariants(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Assert the storage invariants (each job in one table, in a state that table
    holds; docs/architecture.md, Tables); returns the rows it read."""
    all_rows = await rows(conn)
    seen: dict[int, str] = {}
    for r in all_rows:
        assert r["id"] not in seen, f"job {r['id']} is in both {seen[r['id']]} and {r['tbl']}"
        seen[r["id"]] = r["tbl"]
        assert r["state"] in TABLE_STATES[r["tbl"]], \
            f"job {r['id']} is {r['state']} in table {r['tbl']}"
        assert 0 <= r["attempt"] <= r["max_attempts"], \
            f"job {r['id']}: attempt {r['attempt']} of {r['max_attempts']}"
        assert r["run_lease"] >= 0
        if r["state"] == "completed":
            assert r["progress"] is None, f"completed job {r['id']} kept its progress"
    holders: dict[bytes, int] = {}
    for r in all_rows:
        if r["unique_key"] is not None and r["unique_states"] & STATE_BITS[r["state"]]:
            other = holders.setdefault(bytes(r["unique_key"]), r["id"])
            assert other == r["id"], f"jobs {other} and {r['id']} share a unique key"
    claims = {bytes(c["unique_key"]): c["job_id"]
              for c in await conn.fetch("SELECT unique_key, job_id FROM awa.unique_claims")}
    assert claims == holders, f"unique claims {claims} != holders {holders}"
    return all_rows


# -- adversarial values --------------------------------------------------------------

BAD_TEXT = st.one_of(
    st.just(""), st.just("\x00"), st.text(min_size=1, max_size=5).map(lambda s: s + "\x00"),
    st.just("x" * 201), st.just("é" * 201), st.just("\ud800"),
    st.text(min_size=201, max_size=300))
"""Strings that no name (kind, queue, tag...) accepts."""

WEIRD_TEXT = st.one_of(
    st.text(max_size=30), BAD_TEXT, st.just("Robert'); DROP TABLE awa.jobs;--"),
    st.just("\u202e\u0000\ufeff"), st.just("🦀" * 60), st.just("%s %d {0} $1"))
"""Any string, favouring the nasty ones."""

NOT_INT = st.one_of(
    st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.none(), st.lists(st.integers(), max_size=2), st.just(math.nan),
    st.decimals(allow_nan=False, allow_infinity=False, places=2))
"""Values of the wrong type where an integer belongs."""

HUGE_INTS = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63),
                      st.sampled_from([-(2**63) - 1, 2**63, 2**64, 10**30, -(10**30)]))

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), WEIRD_TEXT)
JSONISH = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(WEIRD_TEXT, inner, max_size=3)), max_leaves=6)
"""JSON-shaped values with adversarial strings (NUL bytes, lone surrogates...)."""

NON_JSON = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf),
                     st.just(object()), st.just({1j: 1}), st.just(b"\x00bytes"),
                     st.just({"k": {1, 2}}), st.just([math.nan]))
"""Values that are not JSON at all."""
