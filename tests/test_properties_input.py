"""Random bad input to every public entry point: a typed error, and nothing written.

Enqueue paths (insert, insert_many_copy, enqueue_many_copy, transactions, the
asyncpg bridge), admin, DLQ and callback methods, handler outcomes, the HTTP
callback ingress, the web UI's JSON API and the CLI. Every rejection must be
an `awa.AwaError` (a `ValidationError` names its field and rule), raised
before anything is written; HTTP answers 4xx JSON, never 500; the CLI exits
non-zero with no traceback.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

import asyncpg
from hypothesis import example, given
from hypothesis import strategies as st
from tests.helpers import ROOT
from tests.prop_support import (
    BAD_TEXT,
    HUGE_INTS,
    NON_JSON,
    NOT_INT,
    WEIRD_TEXT,
    counts,
    prop_settings,
)

import awa
from awa.core import serialize, validate
from awa.testing import AwaTestClient, JobRow
from awa.web.callbacks import callback_app
from awa.web.ui import ui_app


@dataclass
class Ping:
    n: int


NOT_STR = st.one_of(st.integers(), st.booleans(), st.floats(), st.lists(st.text(), max_size=2),
                    st.just(b"bytes"))
BAD_ID = st.one_of(NOT_INT.filter(lambda v: v is not None), HUGE_INTS.filter(
    lambda v: not -(2**63) <= v < 2**63))
BAD_OPTION = st.one_of(
    st.tuples(st.just("kind"), st.one_of(BAD_TEXT, NOT_STR)),
    st.tuples(st.just("queue"), st.one_of(BAD_TEXT, NOT_STR, st.none())),
    st.tuples(st.just("priority"), st.one_of(NOT_INT, st.sampled_from([0, 5, -1, 2**40]))),
    st.tuples(st.just("max_attempts"), st.one_of(NOT_INT, st.sampled_from([0, 1001, -5]))),
    st.tuples(st.just("tags"), st.sampled_from([
        ["t"] * 21, ["a\x00"], ["ok", "\ud800"], "a-string", 5, [1, 2], ["ok", None]])),
    st.tuples(st.just("metadata"), st.one_of(
        st.just([1]), st.just("meta"), st.just(7),
        st.dictionaries(st.sampled_from(["k", "\x00", "\ud800"]), NON_JSON, min_size=1),
        st.just({"k": "\x00"}), st.just({"\ud800": 1}), st.just({(1, 2): 1}))),
    st.tuples(st.just("run_at"), st.one_of(
        st.just("2024-01-01"), st.just(17), st.just(date(2024, 1, 1)),
        st.just(datetime.min.replace(tzinfo=timezone(timedelta(hours=14)))),
        st.just(datetime.max.replace(tzinfo=timezone(timedelta(hours=-14)))))),
    st.tuples(st.just("unique_opts"), st.one_of(
        st.just([]), st.just("x"), st.just({"nope": 1}), st.just({"by_args": 1}),
        st.just({"by_queue": "yes"}), st.just({"states": 0}), st.just({"states": 256}),
        st.just({"states": True}), st.just({"by_period": 2**63}),
        st.just({"by_period": 1.5}))),
    st.tuples(st.just("ordering_key"), st.one_of(BAD_TEXT, NOT_STR)),
    st.tuples(st.just("args"), st.one_of(
        st.just(5), st.just("args"), st.just(None), st.just([1, 2]),
        st.builds(lambda v: {"v": v}, NON_JSON), st.just({"v": "\x00"}),
        st.just({"v": "\ud800"}), st.just({"\ud800": 1}), st.just(Ping(math.nan)),
        st.just(Ping("\ud800")))),  # type: ignore[arg-type]
)


def _expect_awa_error(exc: BaseException | None) -> None:
    assert isinstance(exc, awa.AwaError), f"expected an AwaError, got {exc!r}"
    if isinstance(exc, awa.ValidationError):
        assert exc.field and exc.rule


async def _raises(coro: Any) -> BaseException | None:
    try:
        await coro
    except Exception as exc:
        return exc
    return None


@prop_settings(60)
@given(bad=BAD_OPTION, path=st.sampled_from(["insert", "many", "copy", "tx", "tx_many",
                                             "bridge"]), good_first=st.booleans())
@example(bad=("args", {"v": "\ud800"}), path="copy", good_first=True)  # was UnicodeEncodeError
@example(bad=("kind", "\ud800"), path="insert", good_first=False)  # was DatabaseError
@example(bad=("args", {"\ud800": 1}), path="insert", good_first=False)  # hashed before validated
async def test_enqueue_rejects_bad_input(client: awa.AsyncClient, conn: asyncpg.Connection,
                                         bad: tuple[str, Any], path: str,
                                         good_first: bool) -> None:
    """Every enqueue path rejects a bad value with a typed error and writes nothing."""
    field, value = bad
    args: Any = value if field == "args" else Ping(1)
    opts: dict[str, Any] = {} if field == "args" else {field: value}
    if field == "args" and isinstance(value, dict):
        opts["kind"] = "ping"
    if field == "args":
        opts["unique_opts"] = {}
    before = await counts(conn)
    batch = [Ping(2), args] if good_first else [args]
    if path == "insert":
        exc = await _raises(client.insert(args, **opts))
    elif path == "many":
        exc = await _raises(client.insert_many_copy(batch, **opts))
    elif path == "copy":
        exc = await _raises(client.enqueue_many_copy(batch, **opts))
    elif path == "bridge":
        async with (await client.pool()).acquire() as c, c.transaction():
            exc = await _raises(awa.bridge.insert_job(c, args, **opts))
            assert await c.fetchval("SELECT 1") == 1  # rejected before any statement ran
    else:
        async with client.transaction() as tx:
            if path == "tx":
                exc = await _raises(tx.insert(args, **opts))
            else:
                exc = await _raises(tx.insert_many(batch, **opts))
            assert await tx.fetch_one("SELECT 1 AS one") == {"one": 1}
    _expect_awa_error(exc)
    assert await counts(conn) == before


ADMIN_CALLS = st.sampled_from([
    "get_job", "cancel", "retry", "dump_job", "dump_run", "get_dlq_job", "retry_from_dlq",
    "move_failed_to_dlq", "purge_dlq_job"])
NAME_CALLS = st.sampled_from([
    "pause_queue", "resume_queue", "drain_queue", "discard_failed", "retry_failed_kind",
    "retry_failed_queue", "list_jobs_kind", "list_jobs_queue", "list_dlq_tag", "dlq_depth",
    "bulk_retry_from_dlq", "purge_dlq", "delete_cron_job", "pause_cron_job",
    "trigger_cron_job", "cancel_by_unique_key", "paused_by", "move_reason"])


def _name_call(client: awa.AsyncClient, name: str, v: Any) -> Any:
    c = client
    return {
        "pause_queue": lambda: c.pause_queue(v), "resume_queue": lambda: c.resume_queue(v),
        "drain_queue": lambda: c.drain_queue(v), "discard_failed": lambda: c.discard_failed(v),
        "retry_failed_kind": lambda: c.retry_failed(kind=v),
        "retry_failed_queue": lambda: c.retry_failed(queue=v),
        "list_jobs_kind": lambda: c.list_jobs(kind=v),
        "list_jobs_queue": lambda: c.list_jobs(queue=v),
        "list_dlq_tag": lambda: c.list_dlq(tag=v), "dlq_depth": lambda: c.dlq_depth(queue=v),
        "bulk_retry_from_dlq": lambda: c.bulk_retry_from_dlq(queue=v),
        "purge_dlq": lambda: c.purge_dlq(kind=v), "delete_cron_job": lambda: c.delete_cron_job(v),
        "pause_cron_job": lambda: c.pause_cron_job(v),
        "trigger_cron_job": lambda: c.trigger_cron_job(v),
        "cancel_by_unique_key": lambda: c.cancel_by_unique_key(v),
        "paused_by": lambda: c.pause_queue("q", v),
        "move_reason": lambda: c.bulk_move_failed_to_dlq(queue="q", reason=v),
    }[name]()


@prop_settings(60)
@given(call=ADMIN_CALLS, bad_id=BAD_ID, name_call=NAME_CALLS,
       bad_name=st.one_of(BAD_TEXT.filter(lambda s: s != ""), NOT_STR),
       numbers=st.sampled_from(["limit", "before_id", "period", "attempt"]), number=BAD_ID)
@example(call="get_job", bad_id=True, name_call="list_jobs_kind", bad_name="\x00",
         numbers="period", number=2**70)  # job 1 was returned; DatabaseError; struct.error
async def test_admin_rejects_bad_input(client: awa.AsyncClient, conn: asyncpg.Connection,
                                       call: str, bad_id: Any, name_call: str, bad_name: Any,
                                       numbers: str, number: Any) -> None:
    """Admin, DLQ and cron methods reject bad ids, names and numbers, writing nothing."""
    job = await client.insert(Ping(1))
    if name_call in ("list_dlq_tag", "paused_by", "move_reason") and isinstance(bad_name, str) \
            and not ("\x00" in bad_name or "\ud800" in bad_name):
        bad_name += "\x00"  # free text: any length is fine, NUL bytes are not
    before = await counts(conn)
    method = getattr(client, call)
    _expect_awa_error(await _raises(method(bad_id)))
    _expect_awa_error(await _raises(_name_call(client, name_call, bad_name)))
    number_calls = {"limit": lambda: client.list_jobs(limit=number),
                    "before_id": lambda: client.list_dlq(before_id=number),
                    "period": lambda: client.cancel_by_unique_key("ping", period_bucket=number),
                    "attempt": lambda: client.dump_run(job.id, number)}
    _expect_awa_error(await _raises(number_calls[numbers]()))
    assert await counts(conn) == before
    assert (await client.get_job(job.id)).state is awa.JobState.Available


async def _parked(client: awa.AsyncClient) -> tuple[awa.Job, str]:
    """A job waiting for a callback, and its callback id."""
    await client.insert(Ping(1))

    async def park(job: Any) -> object:
        return awa.WaitForCallback(await job.register_callback())
    result = await AwaTestClient(client).work_one(Ping, park)
    assert isinstance(result.job, JobRow) and result.job.snapshot is not None
    job = result.job.snapshot
    assert job.callback_id is not None
    return job, job.callback_id


CALLBACK_ACTIONS = st.sampled_from(["complete", "fail", "retry", "resume", "heartbeat"])


@prop_settings(50)
@given(action=CALLBACK_ACTIONS, which=st.sampled_from(["real", "malformed", "unknown"]),
       malformed=st.one_of(WEIRD_TEXT, NOT_STR, st.none()),
       payload=st.one_of(NON_JSON, st.just("\x00"), st.just({"k": "\ud800"}),
                         st.just(["\ud800"])),
       error=st.one_of(NOT_STR, st.just("\x00"), st.just("\ud800")),
       timeout=st.one_of(st.sampled_from([-1, math.nan, math.inf, -math.inf, 1e300, 1e12,
                                          True]), st.text(max_size=3)))
@example(action="heartbeat", which="real", malformed="", payload=math.nan, error=5,
         timeout=1e12)  # wrote a year-33000 timeout, then raised OverflowError
async def test_callbacks_reject_bad_input(client: awa.AsyncClient, conn: asyncpg.Connection,
                                          action: str, which: str, malformed: Any,
                                          payload: Any, error: Any, timeout: Any) -> None:
    """Callback resolution with bad ids, payloads, errors or timeouts changes nothing."""
    job, cid = await _parked(client)
    target: Any = {"real": cid, "unknown": str(uuid.uuid4()), "malformed": malformed}[which]
    if which == "malformed":
        try:
            uuid.UUID(str(malformed))
            return  # by chance a valid UUID
        except ValueError:
            pass
    before = await counts(conn)
    calls = {"complete": lambda: client.complete_external(target, payload),
             "resume": lambda: client.resume_external(target, payload),
             "fail": lambda: client.fail_external(target, error),
             "heartbeat": lambda: client.heartbeat_callback(target, timeout),
             "retry": lambda: client.retry_external(target)}
    if which == "real" and action == "retry":
        return  # a valid retry of a real callback is not bad input
    exc = await _raises(calls[action]())
    _expect_awa_error(exc)
    if which == "unknown" and not isinstance(exc, awa.ValidationError | awa.SerializationError):
        assert isinstance(exc, awa.CallbackNotFound)
    assert await counts(conn) == before
    after = await client.get_job(job.id)
    assert (after.state, after.callback_id, after.callback_timeout_at) == (
        job.state, job.callback_id, job.callback_timeout_at)


@prop_settings(30)
@given(kind=st.sampled_from(["retry_after", "snooze"]),
       seconds=st.one_of(st.sampled_from([math.nan, math.inf, -1, 1e300, 10**30, True, "5"]),
                         st.floats(allow_nan=True, allow_infinity=True)))
@example(kind="retry_after", seconds=math.nan)  # the write failed; the job stayed running
async def test_handler_outcomes_never_strand_a_job(client: awa.AsyncClient, kind: str,
                                                   seconds: Any) -> None:
    """Any RetryAfter/Snooze value ends the attempt in a legal state, never left running."""
    await client.insert(Ping(1), max_attempts=3)

    async def handler(job: Any) -> object:
        return awa.RetryAfter(seconds) if kind == "retry_after" else awa.Snooze(seconds)
    result = await AwaTestClient(client).work_one(Ping, handler)
    assert isinstance(result.job, JobRow)
    assert result.job.state in ("retryable", "scheduled")
    await (await client.pool()).execute("DELETE FROM awa.jobs")


# -- HTTP: the callback ingress and the UI's JSON API, called as ASGI apps ---------------

async def asgi(app: Any, method: str, path: str, body: bytes = b"",
               headers: list[tuple[bytes, bytes]] | None = None,
               query: bytes = b"") -> tuple[int, Any]:
    """One request through an ASGI app; returns (status, parsed JSON body or None)."""
    sent: list[dict[str, Any]] = []
    chunks = [body]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop() if chunks else b"",
                "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(
        "utf-8", "surrogatepass"), "query_string": query, "root_path": "",
        "headers": [(b"content-type", b"application/json"), *(headers or [])],
        "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
        "http_version": "1.1", "asgi": {"version": "3.0"}}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


BAD_BODIES = st.one_of(
    st.binary(max_size=40), st.just(b"NaN"), st.just(b"[1,2]"), st.just(b'"text"'),
    st.just(b"\xff\xfe"), st.just(b'{"payload": NaN}'), st.just(b'{"payload": Infinity}'),
    st.just(b'{"error": 5}'), st.just(b'{"error": "\\u0000"}'), st.just(b'{"error": "\\ud800"}'),
    st.just(b'{"payload": "\\ud800"}'), st.just(b'{"timeout_seconds": "x"}'),
    st.just(b'{"timeout_seconds": -1}'), st.just(b'{"timeout_seconds": 1e400}'),
    st.just(b'{"timeout_seconds": true}'), st.just(b'{"timeout_seconds": 1e12}'),
    st.just(b"{" * 50 + b"}" * 50), st.just(b" " * 10))


@prop_settings(60)
@given(action=st.sampled_from(["complete", "fail", "resume", "heartbeat"]), body=BAD_BODIES,
       which=st.sampled_from(["real", "unknown", "garbage"]), garbage=WEIRD_TEXT,
       secret=st.booleans(), header=st.binary(min_size=1, max_size=8))
@example(action="fail", body=b"{}", which="real", garbage="", secret=True,
         header=b"\xff")  # a non-UTF-8 header was a 500
async def test_callback_http_rejects_bad_requests(client: awa.AsyncClient,
                                                  conn: asyncpg.Connection, action: str,
                                                  body: bytes, which: str, garbage: str,
                                                  secret: bool, header: bytes) -> None:
    """Bad bodies, ids or signatures get a 4xx JSON error and change nothing."""
    job, cid = await _parked(client)
    app = callback_app(client, secret=b"k" * 32 if secret else None)
    target = {"real": cid, "unknown": str(uuid.uuid4()), "garbage": garbage.replace("/", "")
              or "x"}[which]
    headers = [(b"x-awa-signature", header), (b"x-other", header)]
    if which == "real" and not secret and _valid_callback_body(action, body):
        return  # not bad input
    before = await counts(conn)
    status, data = await asgi(app, "POST", f"/api/callbacks/{target}/{action}", body, headers)
    assert 400 <= status < 500, (status, data)
    assert isinstance(data, dict) and data.get("error")
    assert await counts(conn) == before
    after = await client.get_job(job.id)
    assert (after.state, after.callback_timeout_at) == (job.state, job.callback_timeout_at)


def _valid_callback_body(action: str, body: bytes) -> bool:
    """Would the ingress accept this body for ``action`` (by Awa's own validators)?"""
    try:
        data = json.loads(body) if body.strip() else {}
        if not isinstance(data, dict):
            return False
        if action in ("complete", "resume"):
            serialize.dumps(data.get("payload"), "payload")
        elif action == "fail":
            validate.check_text("error", data.get("error"))
        else:
            validate.check_seconds("timeout_seconds", data.get("timeout_seconds", 1.0))
    except (ValueError, awa.AwaError):
        return False
    return True


UI_POSTS = st.sampled_from([
    "/api/jobs/{id}/retry", "/api/jobs/{id}/cancel", "/api/dlq/{id}/retry",
    "/api/dlq/{id}/purge", "/api/queues/{name}/pause", "/api/queues/{name}/resume",
    "/api/queues/{name}/drain", "/api/cron/{name}/pause", "/api/cron/{name}/trigger",
    "/api/jobs/retry-failed", "/api/dlq/retry", "/api/dlq/purge"])
UI_GETS = st.sampled_from(["/api/jobs", "/api/jobs/{id}", "/api/dlq", "/api/queues",
                           "/api/overview", "/api/cron"])
BAD_FILTER_BODIES = st.one_of(
    BAD_BODIES, st.builds(lambda k, v: json.dumps({k: v}).encode(),
                          st.sampled_from(["kind", "queue", "tag"]),
                          st.one_of(st.integers(), st.lists(st.integers(), max_size=1),
                                    st.just("\x00"), st.just("x" * 300), st.just("\ud800"))))


@prop_settings(60)
@given(post=UI_POSTS, get=UI_GETS, body=BAD_FILTER_BODIES,
       bad_id=st.one_of(st.sampled_from(["99999999999999999999999", "0"]),
                        st.integers(min_value=2**63, max_value=2**70).map(str)),
       bad_name=st.one_of(st.just("x" * 201), st.just("\x00"), st.just("\ud800"),
                          st.just("q\x00q")),
       params=st.dictionaries(st.sampled_from(["state", "kind", "queue", "tag", "q", "cursor",
                                               "id"]), WEIRD_TEXT, max_size=3))
@example(post="/api/jobs/retry-failed", get="/api/jobs", body=b'{"kind": "\\ud800"}',
         bad_id="99999999999999999999", bad_name="\x00", params={"cursor": "9" * 30})
@example(post="/api/queues/{name}/pause", get="/api/jobs", body=b"", bad_id="0",
         bad_name="x" * 201, params={"q": "\x00"})  # a NUL in the search was a 500
async def test_ui_api_rejects_bad_requests(client: awa.AsyncClient, conn: asyncpg.Connection,
                                           post: str, get: str, body: bytes, bad_id: str,
                                           bad_name: str, params: dict[str, str]) -> None:
    """Random bad paths, params and bodies: 4xx JSON (or a 200 read), never a 500."""
    app = ui_app(client=client)
    await client.insert(Ping(1))
    before = await counts(conn)
    path = post.replace("{id}", bad_id).replace("{name}", bad_name)
    status, data = await asgi(app, "POST", path, body, [(b"x-awa-request", b"1")])
    assert 400 <= status < 500, (path, status, data)
    assert isinstance(data, dict) and data.get("error")
    assert await counts(conn) == before
    query = urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in params.items()})
    status, data = await asgi(app, "GET", get.replace("{id}", bad_id), query=query.encode())
    assert status < 500, (get, params, status, data)
    if status >= 400:
        assert isinstance(data, dict) and data.get("error")


# -- the CLI, as a subprocess -----------------------------------------------------------

CLI_ARGS = st.one_of(
    st.builds(lambda i: ["job", "dump", i], st.sampled_from(["x", "-1e9", "1.5", "9" * 25])),
    st.builds(lambda i: ["job", "retry", "--yes", i], st.sampled_from(["9" * 25, "abc"])),
    st.builds(lambda n: ["job", "list", "--limit", n], st.sampled_from(["0", "-3", "x", "1e9"])),
    st.builds(lambda s: ["job", "list", "--state", s], st.sampled_from(["nope", "", "DROP"])),
    st.builds(lambda q: ["queue", "pause", q], st.sampled_from(["x" * 201, ""])),
    st.builds(lambda a: ["enqueue", "kind", "--args", a], st.sampled_from(
        ["{", "[1]", "NaN", '{"a": NaN}', '"s"', '{"a": "\\u0000"}', '{"a": "\\ud800"}'])),
    st.builds(lambda p: ["enqueue", "kind", "--priority", p], st.sampled_from(["0", "9", "x"])),
    st.builds(lambda a: ["job", "dump-run", "1", "--attempt", a], st.sampled_from(["0", "x"])),
    st.builds(lambda n: ["dlq", "list", "--limit", n], st.sampled_from(["0", "100000"])),
    st.just(["job", "retry-failed", "--yes"]), st.just(["dlq", "purge", "--yes"]),
    st.builds(lambda q: ["dlq", "depth", "--queue", q], st.sampled_from(["x" * 300])))


@prop_settings(10)
@given(argv=CLI_ARGS)
def test_cli_rejects_bad_arguments(database_url: str, argv: list[str]) -> None:
    """Bad CLI arguments exit non-zero with a short error and no traceback."""
    env = {**os.environ, "DATABASE_URL": database_url, "AWA_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-m", "awa", *argv], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, (argv, proc.stdout)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 1:
        assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    else:  # a usage error, in click's own format
        assert lines and lines[-1].startswith("Error:"), proc.stderr

