"""A parent deleted by hand does not leave its children parked forever (issue 40).

Deleting a job with SQL is no finish: nothing releases its children. The
cleanup service finds children still waiting for a parent that exists
nowhere and applies their ``on_parent_failure`` as if it had been cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

import awa
from awa.db.queries import queries
from awa.maintenance.services import Cleaner


@dataclass
class Step:
    name: str


def _cleaner(pool: asyncpg.Pool) -> Cleaner:
    return Cleaner(pool, queries(), timedelta(minutes=1), lambda: True,
                   retentions=[timedelta(days=1)], batch_size=100,
                   dlq_retention=timedelta(days=30), failed_retention=timedelta(days=2))


async def test_children_of_a_deleted_parent_follow_their_policy(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    gone = await client.insert(Step("gone"), run_at=later)
    other = await client.insert(Step("other"), run_at=later)
    cancel = await client.insert(Step("cancel"), after=[gone])
    discard = await client.insert(Step("discard"), after=[gone], on_parent_failure="discard")
    anyway = await client.insert(Step("anyway"), after=[gone], on_parent_failure="run_anyway")
    both = await client.insert(Step("both"), after=[gone, other],
                               on_parent_failure="run_anyway")
    grandchild = await client.insert(Step("grandchild"), after=[cancel])
    untouched = await client.insert(Step("untouched"), after=[other])
    await conn.execute("DELETE FROM awa.jobs WHERE id = $1", gone.id)

    cleaner = _cleaner(await client.pool())
    await cleaner.run_once()
    assert cleaner.orphans_released >= 4
    cancelled = await client.get_job(cancel.id)
    assert cancelled.state is awa.JobState.Cancelled
    assert cancelled.errors[-1]["error"] == f"parent job {gone.id} cancelled"
    assert (await client.get_job(grandchild.id)).state is awa.JobState.Cancelled
    with pytest.raises(awa.JobNotFound):
        await client.get_job(discard.id)
    assert (await client.get_job(anyway.id)).state is awa.JobState.Available
    # Still parked for the parent that exists.
    for waiting in (both, untouched):
        assert (await client.get_job(waiting.id)).state is awa.JobState.Scheduled
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies "
                               "WHERE parent_id = $1 AND resolved_at IS NULL", gone.id) == 0
    # The graph no longer calls the deleted parent "discarded".
    nodes = {n.id: n for n in (await client.workflow(both.id)).nodes}
    assert nodes[gone.id].status == "gone" and nodes[both.id].status == "waiting"
    assert {n.id: n.status for n in (await client.workflow(discard.id)).nodes}[discard.id] \
        == "discarded"
    # Its finish releases the rest as usual; a second pass finds nothing to do.
    before = cleaner.orphans_released
    await cleaner.run_once()
    assert cleaner.orphans_released == before
    assert (await client.get_job(both.id)).state is awa.JobState.Scheduled


async def test_parents_finished_or_dead_lettered_are_not_orphans(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """A parent that left awa.jobs by finishing is found where it went."""
    parent = await client.insert(Step("p"), run_at=datetime.now(UTC) + timedelta(hours=1))
    child = await client.insert(Step("c"), after=[parent])
    # Its edge left unresolved by hand, as if the finish were in flight.
    await conn.execute("UPDATE awa.jobs SET metadata = metadata - '_awa_dependents' "
                       "WHERE id = $1", parent.id)
    await client.cancel(parent.id)
    assert await conn.fetchval("SELECT count(*) FROM awa.job_dependencies "
                               "WHERE resolved_at IS NULL") == 1
    cleaner = _cleaner(await client.pool())
    await cleaner.run_once()
    assert cleaner.orphans_released == 0
    assert (await client.get_job(child.id)).state is awa.JobState.Scheduled
