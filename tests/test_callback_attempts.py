"""Callback attempts: a resumed or retried callback job uses its attempts as the
model says, and callback timeouts cope with a taken unique key.

Each case was first found by `tests.test_properties_state` (see that module) and
is kept here as a plain test; the fix is in the package.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
from tests.prop_state_model import Task
from tests.prop_support import check_invariants

import awa
from awa.maintenance.services import Rescuer
from awa.testing import AwaTestClient, JobRow


async def _park(harness: AwaTestClient, *, early: str | None = None) -> awa.Job:
    async def handler(job: Any) -> object:
        token = await job.register_callback()
        if early == "resume":
            await harness.client.resume_external(token.id, "early")
        return awa.WaitForCallback(token)
    result = await harness.work_one(Task, handler, queue="q1")
    assert isinstance(result.job, JobRow) and result.job.snapshot is not None
    return result.job.snapshot


async def test_redispatch_after_resume_does_not_consume_an_attempt(
        client: awa.AsyncClient) -> None:
    """Resume of a parked (or not yet parked) job re-runs the same attempt:
    attempt never passed max_attempts (was 2 of 1)."""
    harness = AwaTestClient(client)
    for early in ("resume", None):
        job = await client.insert(Task(1, 0), queue="q1", max_attempts=1)
        parked = await _park(harness, early=early)
        if early is None:
            assert parked.callback_id is not None
            await client.resume_external(parked.callback_id, "late")
        assert (await client.get_job(job.id)).attempt == 0
        done = await harness.work_one(Task, lambda j: None, queue="q1")
        assert isinstance(done.job, JobRow) and done.job.id == job.id
        assert (done.job.state, done.job.attempt) == ("completed", 1)


async def test_retry_external_grants_one_more_attempt(client: awa.AsyncClient) -> None:
    """retry_external of a job on its last attempt: the next run is attempt 1 of 1, not 2."""
    harness = AwaTestClient(client)
    await client.insert(Task(1, 0), queue="q1", max_attempts=1)
    parked = await _park(harness)
    assert parked.callback_id is not None
    assert (await client.retry_external(parked.callback_id)).attempt == 0
    done = await harness.work_one(Task, lambda j: None, queue="q1")
    assert isinstance(done.job, JobRow) and (done.job.attempt, done.job.max_attempts) == (1, 1)


async def test_callback_timeout_with_its_unique_key_taken(client: awa.AsyncClient,
                                                          conn: asyncpg.Connection) -> None:
    """A parked job released its unique key and a duplicate took it: the timeout
    rescue fails it (failed is not covered) instead of aborting every rescue."""
    harness = AwaTestClient(client)
    waiting = await client.insert(Task(1, 0), queue="q1", unique_opts={})
    await _park(harness)
    plain = await client.insert(Task(2, 0), queue="q1")
    await _park(harness)
    other = await client.insert(Task(1, 0), queue="q1", unique_opts={})
    await conn.execute("UPDATE awa.jobs SET callback_timeout_at = now() - interval '1 second'"
                       " WHERE state = 'waiting_external'")
    pool = await client.pool()
    await Rescuer(pool, client._q, timedelta(seconds=1), lambda: True,
                  staleness=timedelta(seconds=90),
                  failed_retention=awa.core.states.FAILED_RETENTION).run_once()
    failed = await client.get_job(waiting.id)
    assert failed.state is awa.JobState.Failed and "unique key" in failed.errors[-1]["error"]
    assert (await client.get_job(plain.id)).state is awa.JobState.Retryable
    assert (await client.get_job(other.id)).state is awa.JobState.Available
    await check_invariants(conn)


async def test_two_parked_duplicates_time_out_together(client: awa.AsyncClient,
                                                       conn: asyncpg.Connection) -> None:
    """Two parked jobs with one released key time out in one rescue batch: one retries,
    the other fails, and the batch commits."""
    harness = AwaTestClient(client)
    first = await client.insert(Task(1, 0), queue="q1", unique_opts={})
    await _park(harness)
    second = await client.insert(Task(1, 0), queue="q1", unique_opts={})
    await _park(harness)
    await conn.execute("UPDATE awa.jobs SET callback_timeout_at = now() - interval '1 second'")
    await Rescuer(await client.pool(), client._q, timedelta(seconds=1), lambda: True,
                  staleness=timedelta(seconds=90),
                  failed_retention=awa.core.states.FAILED_RETENTION).run_once()
    states = [(await client.get_job(j.id)).state for j in (first, second)]
    assert states == [awa.JobState.Retryable, awa.JobState.Failed]
    await check_invariants(conn)


