"""Secrets and job args never leak; callbacks need valid signatures (docs/security.md).

The web UI's access token (mutations refused without it) is tested in
tests/test_ui_api.py (``test_read_only_and_token``, ``test_awa_serve_subprocess``),
and its read-only mode for a SELECT-only role in tests/test_roles.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import subprocess
import sys
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pydantic
import pytest
from tests.helpers import (
    FAST,
    ROOT,
    SUBPROCESS_PATH,
    TO_MUTABLE,
    wait_for_state,
    wait_until,
)
from tests.test_callbacks import _post
from tests.ui_helpers import call, serving

import awa
from awa.core import callback_contract
from awa.db.dsn import redact
from awa.db.roles import grants_sql
from awa.web.ui import ui_app

DB_PASSWORD = "dbpw-" + secrets.token_hex(8)
UI_TOKEN = "uitok-" + secrets.token_hex(8)
CALLBACK_SECRET = "cbsec-" + secrets.token_hex(13)  # 32 bytes
SECRETS = (DB_PASSWORD, UI_TOKEN, CALLBACK_SECRET)


def _with_user(url: str, user: str, password: str, port: int | str | None = None) -> str:
    parts = urlsplit(url)
    port = parts.port if port is None else port
    netloc = f"{user}:{quote(password)}@{parts.hostname or '127.0.0.1'}" + (
        f":{port}" if port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def secret_url(database_url: str) -> AsyncIterator[str]:
    """The test database through a runtime role that has a password."""
    role = f"awa_t_secret_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{DB_PASSWORD}'")
        await admin.execute(grants_sql(role))
        yield _with_user(database_url, role, DB_PASSWORD)
    finally:
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.close()
        server = await asyncpg.connect(database_url)
        try:
            await server.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
            await wait_until(lambda: _no_sessions(server, role), message="sessions to end")
            await server.execute(f"DROP ROLE IF EXISTS {role}")
        finally:
            await server.close()


async def _no_sessions(conn: asyncpg.Connection, role: str) -> bool:
    return not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                                   role)


def _leaks(text: str, needles: tuple[str, ...] = SECRETS) -> list[str]:
    return [n for n in needles if n in text]


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@dataclass
class Boom:
    note: str


def test_redact() -> None:
    assert redact("postgresql://u:p%40ss@db:5432/x?sslmode=require") == \
        "postgresql://u:***@db:5432/x?sslmode=require"
    assert redact("connect to postgres://u:p@ss@db/x failed") == \
        "connect to postgres://u:***@db/x failed"
    assert redact("postgresql://u@db/x and postgresql://db:5432/x") == \
        "postgresql://u@db/x and postgresql://db:5432/x"
    assert redact("host=db password='a b\\'c' user=u") == "host=db password=*** user=u"
    assert redact("postgresql://db/x?user=u&password=hunter2&sslmode=require") == \
        "postgresql://db/x?user=u&password=***&sslmode=require"


async def test_secrets_never_reach_logs_errors_or_responses(
        secret_url: str, database_url: str, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG, logger="awa")
    seen: list[str] = []  # every error message, response body and CLI output

    # Bad URLs and failed connections, through the client API.
    bad_urls = [
        _with_user(secret_url, "awa_nobody", DB_PASSWORD),  # authentication fails
        _with_user(secret_url, "awa_nobody", DB_PASSWORD, port=1),  # nothing listens
        _with_user(secret_url, "awa_nobody", DB_PASSWORD, port="notaport"),
        secret_url.replace("postgresql://", "mysql://"),
        secret_url + "?pgbouncer=maybe",
        secret_url.rsplit("/", 1)[0] + "/no_such_database_here",
    ]
    for url in bad_urls:
        with pytest.raises(Exception) as info:  # any error, as long as it is clean
            async with awa.AsyncClient(url) as c:
                await c.queue_stats()
        seen.append(_error_text(info.value))

    # A worker on the password URL: failing jobs, and its health endpoints.
    async with awa.AsyncClient(secret_url) as client:
        @client.task(Boom)
        async def boom(job: awa.JobContext) -> None:
            raise RuntimeError("handler failed")

        job = await client.insert(Boom("x"), max_attempts=2)
        await client.start([("default", 2)], health_addr="127.0.0.1:0", **FAST)
        try:
            await wait_for_state(client, job.id, awa.JobState.Failed)
            assert client.runtime is not None and client.runtime.health_server is not None
            port = client.runtime.health_server.port
            for path in ("/healthz", "/readyz", "/metrics", "/nope"):
                seen.append(str(await _http_get(port, path)))
            seen.append(repr(await client.health_check()))
        finally:
            await client.shutdown()

        # The web UI with a token: refusals, pages, and a database it cannot reach.
        async with serving(ui_app(client=client, token=UI_TOKEN)) as base:
            for path in ("/api/config", "/api/overview", "/api/jobs", f"/api/jobs/{job.id}",
                         "/api/runtime", "/api/queues"):
                seen.append(str(await call(base + path)))
                seen.append(str(await call(base + path, token="wrong")))
                seen.append(str(await call(base + path, token=UI_TOKEN)))
            seen.append(str(await call(f"{base}/api/queues/default/pause", {})))
        unreachable = _with_user(secret_url, "awa_nobody", DB_PASSWORD, port=1)
        async with serving(ui_app(unreachable, token=UI_TOKEN)) as base:
            for path in ("overview", "config"):
                status, body = await call(f"{base}/api/{path}", token=UI_TOKEN)
                assert status == 503 and "database unavailable" in body["error"]
                seen.append(str(body))

        # HTTP callbacks with a secret: refused and accepted calls.
        with pytest.raises(awa.ValidationError) as bad_secret:
            awa.web.callback_app(client, secret=CALLBACK_SECRET + "x")
        seen.append(_error_text(bad_secret.value))
        app = awa.web.callback_app(client, secret=CALLBACK_SECRET)
        cid = str(uuid.uuid4())
        seen.append(str(await _post(app, f"/api/callbacks/{cid}/complete", b"{}")))
        seen.append(str(await _post(app, f"/api/callbacks/{cid}/complete", b"{}",
                                    callback_contract.sign(CALLBACK_SECRET, cid))))

    # The CLI, with the password URL or a broken one.
    env = {**os.environ, "AWA_UI_TOKEN": UI_TOKEN, "PYTHONPATH": SUBPROCESS_PATH}
    env.pop("AWA_PROGRESS", None)
    commands = [[url, "queue", "stats"] for url in bad_urls] + [
        [secret_url, "job", "dump", "999999"],
        [secret_url, "queue", "stats", "--json"],
        [secret_url, "health", "--json"],
        [bad_urls[1], "migrate"],
    ]
    for url, *args in commands:
        result = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "awa", "--database-url", url, *args],
            env=env, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=60)
        seen.append(result.stdout + result.stderr)
    worker = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client"],
        env={**env, "DATABASE_URL": bad_urls[1]}, cwd=ROOT, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=60)
    assert worker.returncode != 0
    seen.append(worker.stdout + worker.stderr)

    out, err = capfd.readouterr()
    logged = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert "auth" in "".join(seen).lower() or "role" in "".join(seen)  # errors were produced
    assert _leaks(logged) == [], "secret in the logs"
    assert _leaks(out + err) == [], "secret on stdout/stderr"
    for text in seen:
        assert _leaks(text) == [], text


@dataclass
class Charge:
    card: str
    step: str


class Strict(pydantic.BaseModel):
    card: int  # the stored args do not fit: rebuilding them fails


async def test_job_args_never_logged(client: awa.AsyncClient, database_url: str,
                                     caplog: pytest.LogCaptureFixture,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG, logger="awa")
    sentinel = "ARGS-SENTINEL-" + secrets.token_hex(6)
    snoozed: set[int] = set()

    @client.task(Charge)
    async def charge(job: awa.JobContext) -> object:
        step = job.args.step
        if step == "retry":
            return awa.RetryAfter(0.05) if job.attempt == 1 else None
        if step == "fail":
            raise ValueError("declined")
        if step == "terminal":
            raise awa.TerminalError("card refused")
        if step == "cancel":
            return awa.Cancel("not needed")
        if step == "snooze" and job.id not in snoozed:
            snoozed.add(job.id)
            return awa.Snooze(0.05)
        return None

    @client.task(kind="strict")
    async def strict(job: awa.JobContext) -> None:
        return None

    def follow_up(args: Any, job: Any) -> None:
        return None

    def hook(event: Any) -> None:
        raise RuntimeError("hook failed")

    client.on_completed_enqueue(Strict, follow_up)       # rebuilding Strict fails
    client.on_retried_enqueue(Charge, follow_up)
    client.on_exhausted_enqueue(Charge, follow_up)
    client.on_rescued_enqueue(Charge, follow_up)
    client.on_event(Charge, hook)

    ids = {step: (await client.insert(Charge(sentinel, step), max_attempts=2)).id
           for step in ("ok", "retry", "fail", "terminal", "cancel", "snooze")}
    strict_job = await client.insert({"card": sentinel}, kind="strict")
    stale = await client.insert(Charge(sentinel, "ok"))
    conn = await asyncpg.connect(database_url)
    try:  # a crashed worker's attempt, for rescue to retry
        await conn.execute(TO_MUTABLE, stale.id)
        await conn.execute("UPDATE awa.jobs SET state = 'running', attempt = 1, run_lease = 1, "
                           "heartbeat_at = now() - interval '1 hour' WHERE id = $1", stale.id)
    finally:
        await conn.close()
    await client.start([("default", 8)], **FAST)
    try:
        terminal = {awa.JobState.Completed, awa.JobState.Failed, awa.JobState.Cancelled}

        async def finished() -> bool:
            jobs = [await client.get_job(i) for i in [*ids.values(), strict_job.id, stale.id]]
            return all(j.state in terminal for j in jobs)
        await wait_until(finished, timeout=30, message="every job to finish")
        assert (await client.get_job(stale.id)).attempt == 2  # rescued, then run again
    finally:
        await client.shutdown()
    out, err = capfd.readouterr()
    assert sentinel not in caplog.text
    assert sentinel not in "".join(r.getMessage() for r in caplog.records)
    assert sentinel not in out + err
    assert any("do not fit Strict" in r.getMessage() for r in caplog.records)
    assert any("rescued: heartbeat stale" in r.getMessage() for r in caplog.records)


async def test_callbacks_need_a_valid_signature(client: awa.AsyncClient) -> None:
    secret = secrets.token_bytes(32)
    app = awa.web.callback_app(client, secret=secret, accept_legacy_signatures=True)
    job = await client.insert(Boom("x"))
    cid, other = str(uuid.uuid4()), str(uuid.uuid4())
    pool = await client.pool()
    await pool.execute(TO_MUTABLE, job.id)
    await pool.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                       "callback_id = $2 WHERE id = $1", job.id, uuid.UUID(cid))
    forged = [
        None,                                                 # no header
        "",                                                   # empty
        callback_contract.sign(secret, other),                # signs another id
        callback_contract.sign(secrets.token_bytes(32), cid),  # another secret
        callback_contract.sign(secret, cid)[:-2],             # truncated
        callback_contract.sign(secret, cid) + "00",           # padded
    ]
    for action in ("complete", "fail", "resume", "heartbeat"):
        for signature in forged:
            status, body = await _post(app, f"/api/callbacks/{cid}/{action}",
                                       b'{"error": "x"}', signature)
            assert status == 401 and body["error"].startswith("signature refused")
    assert (await client.get_job(job.id)).state is awa.JobState.WaitingExternal  # untouched
    with pytest.raises(awa.ValidationError, match="32 bytes"):
        awa.web.callback_app(client, secret=b"short")
    valid = callback_contract.sign(secret, cid).upper()  # hex case does not matter
    status, body = await _post(app, f"/api/callbacks/{cid}/complete", b"{}", valid)
    assert status == 200 and body["state"] == "completed"


async def _http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body
