"""Enqueue: kinds, args types, options, validation before any write."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import asyncpg
import pydantic
import pytest
from tests.helpers import FAST, wait_for_state

import awa
from awa.core import serialize, states


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hi"


class HTMLToPDF(pydantic.BaseModel):
    url: str
    when: datetime | None = None


@pytest.mark.parametrize(("name", "kind"), [
    ("SendEmail", "send_email"), ("SMTPEmail", "smtp_email"), ("HTMLToPDF", "html_to_pdf"),
    ("OAuthRefresh", "o_auth_refresh"), ("already_snake", "already_snake"), ("X", "x"),
])
def test_derive_kind(name: str, kind: str) -> None:
    assert awa.derive_kind(name) == kind


async def test_insert_dataclass_pydantic_and_dict(client: awa.AsyncClient) -> None:
    a = await client.insert(SendEmail("a@example.com"))
    assert (a.kind, a.args) == ("send_email", {"to": "a@example.com", "subject": "hi"})
    when = datetime(2030, 1, 1, tzinfo=UTC)
    b = await client.insert(HTMLToPDF(url="http://x", when=when))
    assert b.kind == "html_to_pdf" and b.args["when"].startswith("2030-01-01")
    c = await client.insert({"x": 1}, kind="raw")
    assert (c.kind, c.args) == ("raw", {"x": 1})
    d = await client.insert(SendEmail("b"), kind="custom_kind")
    assert d.kind == "custom_kind"
    assert a.id < b.id < c.id < d.id


async def test_insert_options_round_trip(client: awa.AsyncClient) -> None:
    job = await client.insert(SendEmail("x"), queue="mail", priority=1, max_attempts=3,
                              tags=["a", "b"], metadata={"m": [1, 2]}, ordering_key="cust-1")
    got = await client.get_job(job.id)
    assert (got.queue, got.priority, got.max_attempts) == ("mail", 1, 3)
    assert got.tags == ["a", "b"] and got.metadata == {"m": [1, 2]}
    assert got.ordering_key == "cust-1" and got.attempt == 0 and got.run_lease == 0
    assert got.state is awa.JobState.Available and str(got.state) == "available"


async def test_run_at_schedules(client: awa.AsyncClient) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    job = await client.insert(SendEmail("x"), run_at=future)
    assert job.state is awa.JobState.Scheduled
    assert abs((job.run_at_datetime - future).total_seconds()) < 0.001
    past = await client.insert(SendEmail("y"), run_at=datetime.now(UTC) - timedelta(hours=1))
    assert past.state is awa.JobState.Available
    naive = await client.insert(SendEmail("z"), run_at=datetime(2100, 1, 1))
    assert naive.run_at_datetime == datetime(2100, 1, 1).astimezone(UTC)  # naive = local time


BAD_INPUTS = [
    ({"priority": 0}, "priority"), ({"priority": 5}, "priority"),
    ({"priority": True}, "priority"), ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"), ({"kind": ""}, "kind"),
    ({"kind": "k" * 201}, "kind"), ({"queue": ""}, "queue"), ({"queue": "q" * 201}, "queue"),
    ({"queue": "a\x00b"}, "queue"), ({"tags": ["t"] * 21}, "tags"),
    ({"tags": ["a\x00"]}, "tags"), ({"tags": "abc"}, "tags"),
    ({"metadata": {"k": "v\x00"}}, "metadata"), ({"metadata": ["no"]}, "metadata"),
    ({"run_at": "2030-01-01"}, "run_at"), ({"unique_opts": {"bogus": 1}}, "unique_opts"),
    ({"unique_opts": {"states": 0}}, "unique_opts.states"),
    ({"unique_opts": {"states": 256}}, "unique_opts.states"),
    ({"unique_opts": {"by_args": "yes"}}, "unique_opts.by_args"),
    ({"ordering_key": ""}, "ordering_key"),
]


@pytest.mark.parametrize(("opts", "field"), BAD_INPUTS)
async def test_bad_input_is_refused_before_writing(client: awa.AsyncClient,
                                                   conn: asyncpg.Connection,
                                                   opts: dict[str, object], field: str) -> None:
    with pytest.raises(awa.ValidationError) as info:
        await client.insert(SendEmail("x"), **opts)  # type: ignore[arg-type]
    assert info.value.field == field and info.value.rule
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0


async def test_args_errors(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    with pytest.raises(awa.ValidationError, match="kind"):
        await client.insert({"a": 1})
    with pytest.raises(awa.ValidationError, match="NUL"):
        await client.insert({"a": "x\x00"}, kind="k")
    with pytest.raises(awa.ValidationError, match="NUL"):
        await client.insert({"a\x00": 1}, kind="k")
    with pytest.raises(awa.SerializationError):
        await client.insert({"a": object()}, kind="k")
    with pytest.raises(awa.SerializationError):
        await client.insert({"a": float("nan")}, kind="k")
    with pytest.raises(awa.SerializationError):
        await client.insert(42, kind="k")
    with pytest.raises(TypeError):
        await client.insert(SendEmail("x"), colour="red")  # type: ignore[call-arg]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    # A backslash-u sequence that merely looks like NUL is fine.
    job = await client.insert({"a": "\\u0000"}, kind="k")
    assert job.args == {"a": "\\u0000"}


async def test_failed_bulk_insert_writes_nothing(client: awa.AsyncClient,
                                                 conn: asyncpg.Connection) -> None:
    jobs = [SendEmail(str(i)) for i in range(5)]
    with pytest.raises(awa.ValidationError, match="priority"):
        await client.insert_many_copy(jobs, opts=[None, None, {"priority": 9}, None, None])
    with pytest.raises(awa.ValidationError):
        await client.enqueue_many_copy([*jobs, {"no": "kind"}])
    with pytest.raises(TypeError):
        await client.enqueue_many_copy(jobs, opts=[{"wat": 1}, None, None, None, None])
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0


def test_shared_options_batch_prepares_each_job_as_insert_does() -> None:
    # prepare_many's one-pass path for a batch with no per-job options must give
    # what preparing each job on its own gives, for every args type, in order.
    from awa.enqueue import producer

    @dataclasses.dataclass
    class Nested:
        when: datetime
        inner: SendEmail

    when = datetime(2026, 1, 2, tzinfo=UTC)
    jobs: list[object] = [SendEmail("a"), {"x": [1, 2.5, None, "é"]}, HTMLToPDF(url="u"),
                          SendEmail("b", "s"), Nested(when, SendEmail("c")), {"y": {}}]
    for defaults in ({"kind": "k", "queue": "q", "tags": ["t"], "priority": 1},
                     {"kind": "k", "metadata": {"m": 1}, "run_at": when}):
        batch = producer.prepare_many(jobs, None, defaults)
        single = [producer.prepare(job, **defaults) for job in jobs]  # type: ignore[arg-type]
        assert batch == single
    routed = producer.prepare_many([SendEmail("a"), SendEmail("b")], [None, {}], {},
                                   router=lambda kind: f"{kind}-queue")
    assert [(j.kind, j.queue) for j in routed] == [("send_email", "send_email-queue")] * 2
    assert routed[0].args_json == '{"to":"a","subject":"hi"}'


@pytest.mark.parametrize(("bad", "error"), [
    (SendEmail("x\x00"), awa.ValidationError), (SendEmail(float("nan")), awa.SerializationError),  # type: ignore[arg-type]
    (SendEmail(object()), awa.SerializationError), ({"no": "kind"}, awa.ValidationError),  # type: ignore[arg-type]
    (42, awa.SerializationError),
])
async def test_bad_job_late_in_a_bulk_insert_writes_nothing(client: awa.AsyncClient,
                                                            conn: asyncpg.Connection,
                                                            bad: object, error: type) -> None:
    jobs = [*(SendEmail(str(i)) for i in range(100)), bad, SendEmail("last")]
    with pytest.raises(error):
        await client.enqueue_many_copy(jobs, queue="q")
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0


def test_json_encoding_errors_are_unchanged_by_the_reused_encoder() -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(awa.SerializationError, match="Circular"):
        serialize.dumps({"a": cyclic}, "args")
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(awa.ValidationError, match="nested deeper"):
        serialize.dumps({"a": deep}, "args")
    assert serialize.dumps({"é": 1.5, "d": datetime(2026, 1, 2, tzinfo=UTC)}, "args") == \
        '{"é":1.5,"d":"2026-01-02T00:00:00+00:00"}'


def test_dumps_many_matches_dumps() -> None:
    deep: object = 1
    for _ in range(200):
        deep = [deep]
    values: list[object] = [{"a": 1}, {"é": "ü"}, {"a": "\\u0000"}, {"l": [[1]] * 100},
                            {"big": "x" * 300_000}, {"d": datetime(2026, 1, 2, tzinfo=UTC)}]
    assert serialize.dumps_many(values, "args") == [serialize.dumps(v, "args") for v in values]
    for bad, error in (({"a": "x\x00"}, awa.ValidationError), ({"deep": deep}, awa.ValidationError),
                       ({"n": float("nan")}, awa.SerializationError),
                       ({"big": "x" * 2_000_000}, awa.ValidationError)):
        with pytest.raises(error):
            serialize.dumps_many([{"ok": 1}, bad], "args")


async def test_bulk_paths(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    jobs = [SendEmail(str(i)) for i in range(500)]
    inserted = await client.insert_many_copy(jobs, queue="bulk", tags=["t"],
                                             opts=[{"priority": 1}] + [None] * 499)
    assert [j.args["to"] for j in inserted] == [str(i) for i in range(500)]
    assert inserted[0].priority == 1 and inserted[1].priority == 2
    assert [j.id for j in inserted] == sorted(j.id for j in inserted)
    count = await client.enqueue_many_copy(jobs, queue="bulk2",
                                           run_at=datetime.now(UTC) + timedelta(minutes=5))
    assert count == 500
    states = await conn.fetch("SELECT queue, state::text, count(*) FROM awa.jobs_all "
                              "GROUP BY 1, 2 ORDER BY 1")
    assert [tuple(r) for r in states] == [("bulk", "available", 500),
                                          ("bulk2", "scheduled", 500)]
    assert await client.enqueue_many_copy([]) == 0
    assert await client.insert_many_copy([]) == []


async def test_copy_of_jobs_due_now_takes_the_servers_time(client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    # run_at is left to its default (now(), as a single insert has it): the
    # transaction's time, the same as created_at, on every row.
    assert await client.enqueue_many_copy([SendEmail(str(i)) for i in range(3)]) == 3
    rows = await conn.fetch("SELECT state::text, run_at = created_at AS same FROM awa.jobs_all")
    assert [tuple(r) for r in rows] == [("available", True)] * 3


async def test_unique_key_matches_reference_rule() -> None:
    import struct

    import blake3

    args = {"b": 2, "a": "é"}
    expected = blake3.blake3(b"k" + b"\x00q" + b'\x00{"a":"\xc3\xa9","b":2}'
                             + b"\x00" + struct.pack("<q", 7)).digest(length=16)
    assert serialize.unique_key("k", "q", args, True, True, 7) == expected
    assert serialize.unique_key("k", "q", args, False, False, None) == \
        blake3.blake3(b"k").digest(length=16)


async def test_notify_on_insert_at_commit(client: awa.AsyncClient, database_url: str) -> None:
    listener = await asyncpg.connect(database_url)
    got: list[str] = []
    await listener.add_listener("awa_jobs", lambda *a: got.append(a[3]))
    try:
        async with client.transaction() as tx:
            await tx.insert(SendEmail("x"), queue="mailq")
            await listener.execute("SELECT 1")  # let any (premature) notify arrive
            assert got == []
        for _ in range(100):
            if got:
                break
            await listener.execute("SELECT 1")
        assert got == ["mailq"]
        got.clear()
        await client.insert(SendEmail("later"), queue="mailq",
                            run_at=datetime.now(UTC) + timedelta(hours=1))
        await listener.execute("SELECT pg_sleep(0.05)")
        assert got == []  # scheduled jobs wake nobody
    finally:
        await listener.close()


@pytest.mark.parametrize("opts", [
    {},
    {"run_at": datetime.now(timezone(timedelta(hours=2))) + timedelta(hours=1), "priority": 1,
     "tags": ["a", "b"], "metadata": {"m": [1, 2.5, None]}, "max_attempts": 3},
    {"run_at": datetime(2020, 1, 2, 3, 4, 5, 678901, UTC), "ordering_key": "o",
     "concurrency_key": "tenant", "max_in_flight": 2},
    {"unique_opts": {"by_args": True}, "queue": "other"},
])
async def test_inserted_job_is_the_stored_job(client: awa.AsyncClient,
                                              opts: dict[str, object]) -> None:
    """`insert` builds its Job from what it sent and what the server chose
    (id, state, created_at): every field must equal the stored row's."""
    args = HTMLToPDF(url="u", when=datetime(2021, 5, 6, tzinfo=UTC))
    job = await client.insert(args, **opts)  # type: ignore[arg-type]
    stored = await client.get_job(job.id)
    for f in dataclasses.fields(awa.Job):
        assert getattr(job, f.name) == getattr(stored, f.name), f.name
    assert job.run_at == stored.run_at and job.created_at == stored.created_at


@pytest.mark.parametrize(("opts", "field"), [
    ({"tags": ["t" * (states.TAG_MAX_LEN + 1)]}, "tags"),
    ({"tags": ["ok", "x" * (8 * 1024 * 1024)]}, "tags"),
    ({"after": [2**63]}, "after"), ({"after": [1, 2**64]}, "after"),
    ({"after": [{"id": 2**63}]}, "after"),
])
async def test_oversized_tags_and_parent_ids_are_refused(
        client: awa.AsyncClient, conn: asyncpg.Connection, opts: dict[str, object],
        field: str) -> None:
    """No size cap on tags (100 MiB went in), and after=[2**63] reached the
    database as a DatabaseError (issue 40): both are `ValidationError`s now."""
    with pytest.raises(awa.ValidationError) as info:
        await client.insert(SendEmail("x"), **opts)  # type: ignore[arg-type]
    assert info.value.field == field and info.value.rule
    with pytest.raises(awa.ValidationError):
        await client.insert_many([SendEmail("y")], **opts)  # type: ignore[arg-type]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    tag = "t" * states.TAG_MAX_LEN  # the longest allowed
    assert (await client.insert(SendEmail("z"), tags=[tag])).tags == [tag]


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is New York for the test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def test_naive_run_at_is_local_time(client: awa.AsyncClient, new_york: None) -> None:
    in_ten = datetime.now() + timedelta(minutes=10)  # naive, New York wall clock
    job = await client.insert({"a": 1}, kind="k", run_at=in_ten)
    assert job.state is awa.JobState.Scheduled
    expected = datetime.now(UTC) + timedelta(minutes=10)
    assert abs(job.run_at_datetime - expected) < timedelta(seconds=5)
    assert job.run_at_datetime == datetime.fromtimestamp(in_ten.timestamp(), UTC)


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


@dataclass
class Address:
    city: str
    since: date


@dataclass
class Invoice:
    at: datetime
    due: date
    amount: Decimal
    ref: uuid.UUID
    tier: Tier
    address: Address
    lines: tuple[int, ...]
    note: str | None = None


async def test_typed_args_come_back_typed(client: awa.AsyncClient) -> None:
    sent = Invoice(at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), due=date(2026, 2, 1),
                   amount=Decimal("12.30"), ref=uuid.uuid4(), tier=Tier.GOLD,
                   address=Address("Oslo", date(2020, 5, 17)), lines=(1, 2))
    got: list[Invoice] = []

    @client.task(Invoice, queue="q")
    async def handle(job: awa.Job) -> None:
        got.append(job.args)

    job = await client.insert(sent, queue="q")
    await client.start([("q", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, awa.JobState.Completed)
    finally:
        await client.shutdown()
    assert got == [sent]
    assert isinstance(got[0].amount, Decimal) and isinstance(got[0].address, Address)


async def test_a_small_pool_is_never_held_up_by_the_producer_connection(
        database_url: str) -> None:
    """The connection a client keeps between inserts goes back to the pool the
    moment anyone asks the pool for one while all are in use: with one
    connection, an insert then a read does not wait for ever; with two, a read
    inside an open transaction neither. Otherwise inserts keep reusing it (no
    pool acquire per insert)."""
    async with awa.AsyncClient(database_url, max_connections=1) as one:
        job = await one.insert(SendEmail(to="a@example.com", subject="one"))
        got = await asyncio.wait_for(one.get_job(job.id), 10)
        assert got.state is awa.JobState.Available
        assert (await asyncio.wait_for(one.queue_stats(), 10)) is not None
        again = await one.insert(SendEmail(to="a@example.com", subject="again"))
        assert (await asyncio.wait_for(one.get_job(again.id), 10)).id == again.id
    # Fresh clients: a read asked for while the pool's second connection is yet
    # to open, then a transaction that takes that connection and waits for it.
    async with awa.AsyncClient(database_url, max_connections=2) as race:
        job = await race.insert(SendEmail(to="b@example.com", subject="race"))
        reader = asyncio.create_task(race.get_job(job.id))
        async with race.transaction() as tx:
            await tx.execute("SELECT 1")
            assert (await asyncio.wait_for(reader, 10)).id == job.id
    async with awa.AsyncClient(database_url, max_connections=2) as race:
        await race.insert(SendEmail(to="b@example.com", subject="race"))
        ev = asyncio.Event()

        async def in_tx_until_read() -> None:
            async with race.transaction():
                await ev.wait()

        async def read_then_set() -> None:
            await race.get_job(job.id)
            ev.set()
        await asyncio.wait_for(asyncio.gather(in_tx_until_read(), read_then_set()), 10)
    async with awa.AsyncClient(database_url, max_connections=2) as two:
        job = await two.insert(SendEmail(to="b@example.com", subject="two"))
        async with two.transaction() as tx:
            await tx.insert(SendEmail(to="c@example.com", subject="in tx"))
            got = await asyncio.wait_for(two.get_job(job.id), 10)
            assert got.id == job.id
        await two.insert(SendEmail(to="d@example.com", subject="first of a run"))
        held = two._producer_conn
        for n in range(20):
            await two.insert(SendEmail(to="d@example.com", subject=f"run {n}"))
            await two.get_job(job.id)  # the other connection serves reads meanwhile
            assert two._producer_conn is held is not None
