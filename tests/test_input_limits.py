"""Input limits: a run_at out of range, JSON nested too deeply and a payload over the
cap are refused before anything is written, on every path a value enters by."""

from __future__ import annotations

import json
import secrets
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import psycopg
import pytest
from tests.test_callbacks import _post

import awa
import awa.web
from awa import callback_contract
from awa.core import serialize, states
from awa.enqueue import bridge

EXTREMES = [datetime.min, datetime.max, datetime.min.replace(tzinfo=UTC),
            datetime.max.replace(tzinfo=UTC),
            datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=6))),
            datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-6)))]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


async def _count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM awa.jobs_all"))


@pytest.mark.parametrize("run_at", EXTREMES)
async def test_run_at_extremes_are_refused_everywhere(client: awa.AsyncClient,
                                                      conn: asyncpg.Connection,
                                                      database_url: str,
                                                      run_at: datetime) -> None:
    attempts = [
        lambda: client.insert({"a": 1}, kind="k", run_at=run_at),
        lambda: client.insert_many_copy([{"a": 1}], kind="k", run_at=run_at),
        lambda: client.enqueue_many_copy([{"a": 1}], kind="k", run_at=run_at),
        lambda: client.insert_many_copy([{"a": 1}], kind="k", opts=[{"run_at": run_at}]),
    ]
    for attempt in attempts:
        with pytest.raises(awa.ValidationError) as err:
            await attempt()
        assert err.value.field == "run_at" and "0001-01-02" in err.value.rule
    async with client.transaction() as tx:
        with pytest.raises(awa.ValidationError):
            await tx.insert({"a": 1}, kind="k", run_at=run_at)
    with psycopg.connect(database_url) as pg, pytest.raises(awa.ValidationError):
        bridge.insert_job_sync(pg, {"a": 1}, kind="k", run_at=run_at)
    assert await _count(conn) == 0


async def test_run_at_edges_of_the_range_are_accepted(client: awa.AsyncClient) -> None:
    early = await client.insert({"a": 1}, kind="k", run_at=states.RUN_AT_MIN)
    late = await client.insert({"a": 1}, kind="k", run_at=states.RUN_AT_MAX)
    assert early.state is awa.JobState.Available and early.run_at_datetime == states.RUN_AT_MIN
    assert late.state is awa.JobState.Scheduled and late.run_at_datetime == states.RUN_AT_MAX


async def test_dlq_retry_refuses_infinite_run_at(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError) as err:
        await client.retry_from_dlq(1, run_at=datetime.max)
    assert err.value.field == "run_at"


async def test_the_schema_refuses_infinite_run_at(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                           "max_attempts, run_at) VALUES ('k', 'q', '{}', 'available', 2, 5, "
                           "'-infinity')")


@pytest.mark.parametrize("depth", [states.JSON_MAX_DEPTH + 1, 990, 5000])
async def test_deep_nesting_is_a_validation_error(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection,
                                                  database_url: str, depth: int) -> None:
    deep = _nested(depth)
    for attempt in (lambda: client.insert({"a": deep}, kind="k"),
                    lambda: client.insert({"a": 1}, kind="k", metadata={"m": deep}),
                    lambda: client.insert_many_copy([{"a": deep}], kind="k"),
                    lambda: client.enqueue_many_copy([{"a": deep}], kind="k"),
                    lambda: client.insert({"a": deep}, kind="k", unique_opts={})):
        with pytest.raises(awa.ValidationError) as err:
            await attempt()
        assert "nested deeper than 128" in err.value.rule
    with psycopg.connect(database_url) as pg, pytest.raises(awa.ValidationError):
        bridge.insert_job_sync(pg, {"a": deep}, kind="k")
    assert await _count(conn) == 0


async def test_nesting_up_to_the_limit_round_trips(client: awa.AsyncClient) -> None:
    deep = _nested(states.JSON_MAX_DEPTH - 1)  # inside the args object: depth 128
    job = await client.insert({"a": deep, "s": "[[[[" * 200}, kind="k")
    assert (await client.get_job(job.id)).args == {"a": deep, "s": "[[[[" * 200}


async def test_payload_cap(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    assert serialize.max_payload_bytes() == states.PAYLOAD_MAX_BYTES
    big = "x" * (states.PAYLOAD_MAX_BYTES + 1)
    with pytest.raises(awa.ValidationError) as err:
        await client.insert({"a": big}, kind="k")
    assert err.value.field == "args" and str(states.PAYLOAD_MAX_BYTES) in err.value.rule
    with pytest.raises(awa.ValidationError) as err:
        await client.insert({"a": 1}, kind="k", metadata={"m": big})
    assert err.value.field == "metadata"
    with pytest.raises(awa.ValidationError):  # multi-byte text is measured in bytes
        await client.insert({"a": "é" * (states.PAYLOAD_MAX_BYTES // 2)}, kind="k")
    with pytest.raises(awa.ValidationError):
        await client.enqueue_many_copy([{"a": 1}, {"a": big}], kind="k")
    assert await _count(conn) == 0
    try:
        awa.set_max_payload_bytes(100)
        with pytest.raises(awa.ValidationError):
            await client.insert({"a": "y" * 100}, kind="k")
        awa.set_max_payload_bytes(None)
        await client.insert({"a": big}, kind="k")
        with pytest.raises(awa.ValidationError):
            awa.set_max_payload_bytes(0)
    finally:
        awa.set_max_payload_bytes(states.PAYLOAD_MAX_BYTES)
    assert await _count(conn) == 1


async def test_callback_payloads_are_capped_and_depth_checked(client: awa.AsyncClient) -> None:
    for payload in ({"p": "x" * (states.PAYLOAD_MAX_BYTES + 1)}, {"p": _nested(1000)}):
        with pytest.raises(awa.ValidationError):
            await client.complete_external("00000000-0000-0000-0000-000000000000", payload)


def test_payload_cap_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "2048")
    assert serialize._limit_from_env() == 2048
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "none")
    assert serialize._limit_from_env() is None
    monkeypatch.setenv("AWA_MAX_PAYLOAD_BYTES", "lots")
    with pytest.raises(awa.ValidationError) as err:
        serialize._limit_from_env()
    assert err.value.field == "AWA_MAX_PAYLOAD_BYTES"
    assert json.loads(serialize.dumps({"a": 1}, "args")) == {"a": 1}




@pytest.mark.parametrize("text", ["[" * 129 + "]" * 129, b"[" * 5000 + b"]" * 5000])
def test_json_input_nested_too_deeply_names_its_field(text: str | bytes) -> None:
    with pytest.raises(awa.ValidationError) as err:
        serialize.loads(text, "body")
    assert (err.value.field, err.value.rule) == ("body", serialize.JSON_TOO_DEEP)


def test_json_input_that_is_not_json_names_its_field() -> None:
    with pytest.raises(awa.ValidationError) as err:
        serialize.loads("{nope", "--args")
    assert (err.value.field, err.value.rule) == ("--args", serialize.NOT_JSON)
    assert isinstance(err.value.__cause__, json.JSONDecodeError)  # says where it broke
    assert serialize.loads(b'{"a": [[1]]}', "body") == {"a": [[1]]}
    assert serialize.loads("[" * 128 + "]" * 128, "body")  # up to the limit parses


async def test_callback_bodies_too_deep_or_not_json_are_refused_by_name(
        client: awa.AsyncClient) -> None:
    secret = secrets.token_bytes(32)
    app = awa.web.callback_app(client, secret=secret, accept_legacy_signatures=True)
    cid = str(uuid.uuid4())
    signature = callback_contract.sign(secret, cid)
    for body, error in ((b'{"p":' + b"[" * 200 + b"]" * 200 + b"}", "body is nested too deeply"),
                        (b"{nope", "body is not JSON")):
        assert await _post(app, f"/api/callbacks/{cid}/complete", body, signature) == \
            (400, {"error": error})
