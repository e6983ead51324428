"""CEL callback rules and resolve_callback against real jobs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from tests.helpers import FAST, wait_for_state, wait_until
from tests.ui_helpers import call, serving

import awa
from awa.core import callback_rules
from awa.web import callback_app

pytest.importorskip("cel")


@dataclass
class Payment:
    rule: int


#: The rules each Payment(rule=i) registers.
RULES: list[dict[str, Any]] = [
    {"filter": 'payload.kind == "payment"', "on_fail": 'payload.status == "declined"',
     "on_complete": 'payload.status == "paid"',
     "transform": '{"amount": payload.amount, "ok": true}'},
    {"on_complete": 'payload.status == "paid"'},
    {},
    {"on_complete": "payload.missing.deeper == 1"},
    {"on_complete": "payload.amount + 1"},
]


async def parked(client: awa.AsyncClient, rule: int) -> tuple[int, str]:
    """Insert a Payment whose handler registers RULES[rule] and parks; (job id, callback id)."""
    job = await client.insert(Payment(rule))
    parked_job = await wait_for_state(client, job.id, awa.JobState.WaitingExternal)
    assert parked_job.callback_id is not None
    return job.id, parked_job.callback_id


@pytest.fixture
async def worker(client: awa.AsyncClient) -> Any:
    @client.task(Payment)
    async def handle(job: awa.Job) -> object:
        token = await job.register_callback(timeout_seconds=600, **RULES[job.args.rule])
        return awa.WaitForCallback(token)
    await client.start([("default", 8)], **FAST)
    yield client
    await client.shutdown()


async def test_filter_fail_complete_transform(worker: awa.AsyncClient) -> None:
    c = worker
    job_id, cid = await parked(c, 0)
    r = await c.resolve_callback(cid, {"kind": "refund", "status": "paid"}, "complete")
    assert r.is_ignored() and r.job is None and r.reason == "filter expression returned false"
    r = await c.resolve_callback(cid, {"kind": "payment", "status": "pending"})
    assert r.is_ignored() and "no expression matched" in (r.reason or "")
    assert (await c.get_job(job_id)).state is awa.JobState.WaitingExternal
    r = await c.resolve_callback(cid, {"kind": "payment", "status": "paid", "amount": 12})
    assert r.is_completed() and r.payload == {"amount": 12, "ok": True}
    assert r.job is not None and r.job.state is awa.JobState.Completed
    assert r.job.metadata["_awa_callback_result"] == {"amount": 12, "ok": True}
    with pytest.raises(awa.CallbackNotFound):
        await c.resolve_callback(cid, {"kind": "payment", "status": "paid"})

    # on_fail is checked before on_complete.
    job_id, cid = await parked(c, 0)
    r = await c.resolve_callback(cid, {"kind": "payment", "status": "declined", "amount": 1})
    assert r.is_failed() and r.job is not None and r.job.state is awa.JobState.Failed
    assert "on_fail expression matched" in r.job.errors[-1]["error"]
    pool = await c.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.callback_rules") == 0


async def test_default_actions_and_evaluation_errors(worker: awa.AsyncClient) -> None:
    c = worker
    _, cid = await parked(c, 2)  # no rules: the default decides
    r = await c.resolve_callback(cid, {"x": 1})
    assert r.is_ignored() and "no expressions configured" in (r.reason or "")
    r = await c.resolve_callback(cid, {"x": 1}, default_action="complete")
    assert r.is_completed() and r.payload == {"x": 1}

    _, cid = await parked(c, 3)  # the expression errors on this payload
    r = await c.resolve_callback(cid, {"amount": 5}, default_action="fail")
    assert r.is_failed() and "on_complete expression failed" in (r.reason or "")
    assert r.job is not None and "callback failed" in r.job.errors[-1]["error"]

    _, cid = await parked(c, 4)  # returns a number, not a bool
    r = await c.resolve_callback(cid, {"amount": 5})
    assert r.is_ignored() and "not a bool" in (r.reason or "")
    r = await c.resolve_callback(cid, None)  # malformed payload: null has no fields
    assert r.is_ignored() and "expression failed" in (r.reason or "")

    _, cid = await parked(c, 1)
    with pytest.raises(awa.ValidationError) as err:
        await c.resolve_callback(cid, {}, default_action="explode")
    assert err.value.field == "default_action"
    with pytest.raises(awa.ValidationError):
        await c.resolve_callback("not-a-uuid", {})
    with pytest.raises(awa.CallbackNotFound):
        await c.resolve_callback("00000000-0000-0000-0000-000000000000", {})


async def test_invalid_expression_rejected_at_registration(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError) as err:
        callback_rules.compile_rules(on_complete='payload.status ==')
    assert err.value.field == "on_complete" and "not valid CEL" in err.value.rule
    with pytest.raises(awa.ValidationError) as err:
        callback_rules.compile_rules(filter="")
    assert err.value.field == "filter"

    seen: list[str] = []

    @client.task(Payment)
    async def handle(job: awa.Job) -> None:
        try:
            await job.register_callback(transform="{{ nope")
        except awa.ValidationError as exc:
            seen.append(exc.field)
            raise
    job = await client.insert(Payment(0), max_attempts=1)
    await client.start([("default", 1)], **FAST)
    try:
        failed = await wait_for_state(client, job.id, awa.JobState.Failed)
    finally:
        await client.shutdown()
    assert seen == ["transform"] and failed.callback_id is None
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.callback_rules") == 0


async def test_concurrent_resolutions_are_serialized(worker: awa.AsyncClient) -> None:
    c = worker
    for _ in range(3):
        _, cid = await parked(c, 1)
        results = await asyncio.gather(
            *(c.resolve_callback(cid, {"status": "paid"}) for _ in range(4)),
            return_exceptions=True)
        done = [r for r in results if isinstance(r, awa.ResolveResult)]
        assert len(done) == 1 and done[0].is_completed()
        assert all(isinstance(r, awa.CallbackNotFound) for r in results if r not in done)


async def test_resolve_over_http_and_sync_client(worker: awa.AsyncClient,
                                                 database_url: str) -> None:
    c = worker
    _, cid = await parked(c, 1)
    async with serving(callback_app(c)) as base:
        url = f"{base}/api/callbacks/{cid}/resolve"
        status, body = await call(url, {"payload": {"status": "pending"}})
        assert status == 200 and body["outcome"] == "ignored" and body["id"] is None
        status, body = await call(url, {"payload": {}, "default_action": "nope"})
        assert status == 400
        status, body = await call(url, {"payload": {"status": "paid"}})
        assert status == 200 and body["outcome"] == "completed" and body["state"] == "completed"
        assert (await call(url, {"payload": {"status": "paid"}}))[0] == 404

    _, cid = await parked(c, 1)
    sync = awa.Client(database_url)
    try:
        result = await asyncio.to_thread(sync.resolve_callback, cid, {"status": "paid"})
    finally:
        await asyncio.to_thread(sync.close)
    assert result.is_completed()


async def test_rules_of_callbacks_resolved_otherwise_are_pruned(worker: awa.AsyncClient) -> None:
    c = worker
    _, cid = await parked(c, 1)
    await c.complete_external(cid, {"status": "whatever"})  # bypasses the rules
    pool = await c.pool()
    await pool.execute("UPDATE awa.callback_rules SET created_at = now() - interval '1 hour'")
    await pool.execute(c._q["callback_rules_prune"])
    await wait_until(lambda: _no_rules(pool), message="rules pruned")


async def _no_rules(pool: Any) -> bool:
    return await pool.fetchval("SELECT count(*) FROM awa.callback_rules") == 0
