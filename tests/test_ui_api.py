"""The web UI's JSON API over a real HTTP server and a real database."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from tests.helpers import wait_until
from tests.ui_helpers import Email, call, seed, serving

import awa
from awa.web.ui import data, ui_app


async def test_pages_show_real_data(client: awa.AsyncClient) -> None:
    s = await seed(client)
    async with serving(ui_app(client=client)) as base:
        status, o = await call(f"{base}/api/overview")
        assert status == 200
        assert o["counts"]["failed"] == 1 and o["counts"]["waiting_external"] == 1
        assert o["counts"]["available"] == 1
        assert [f["id"] for f in o["recent_failures"]] == [s.failed_id]
        assert "does not exist" in o["recent_failures"][0]["error"]

        async def charted() -> bool:  # outcome counts are flushed every few seconds
            nonlocal o
            o = (await call(f"{base}/api/overview"))[1]
            return sum(p["completed"] for p in o["series"]) >= 1
        await wait_until(charted, message="the completion to reach the chart")
        assert any(p["wait_ms_avg"] is not None for p in o["series"])
        assert {q["queue"] for q in o["queues"]} >= {"email", "reports"}

        _, job = await call(f"{base}/api/jobs/{s.failed_id}")
        events = [e["event"] for e in job["timeline"]]
        assert events[0] == "created" and events[-1] == "failed"
        assert any("TerminalError" in e["detail"] and "Traceback" not in e["detail"]
                   for e in job["timeline"])
        _, waiting = await call(f"{base}/api/jobs/{s.waiting_id}")
        assert waiting["callback"].startswith("waiting for callback #1 (")
        _, done = await call(f"{base}/api/jobs/{s.completed_id}")
        assert done["job"]["output"] == {"delivered": "ada@example.com"}

        _, queues = await call(f"{base}/api/queues")
        reports = next(q for q in queues["queues"] if q["queue"] == "reports")
        assert reports["available"] == 1 and reports["lag_seconds"] >= 0

        _, cron = await call(f"{base}/api/cron")
        assert [c["name"] for c in cron["cron"]] == ["nightly"]
        assert cron["cron"][0]["next_fire_at"].endswith("03:00:00+00:00")

        _, rt = await call(f"{base}/api/runtime")
        assert len(rt["workers"]) == 1 and rt["workers"][0]["queues"]["email"]["max_workers"] == 4
        assert rt["leader"]["live"] and rt["leader"]["holder"] == rt["workers"][0]["instance_id"]
    await client.shutdown()
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.presence") == 0


async def test_job_filters_search_and_cursor(client: awa.AsyncClient) -> None:
    await client.insert_many_copy([Email(f"user{i}@example.com") for i in range(120)],
                                  queue="bulk")
    await client.insert(Email("needle@example.com"), queue="other", tags=["vip"])
    async with serving(ui_app(client=client)) as base:
        seen: list[int] = []
        cursor = ""
        while True:
            _, page = await call(f"{base}/api/jobs?queue=bulk&cursor={cursor}")
            seen += [j["id"] for j in page["jobs"]]
            if page["next_cursor"] is None:
                break
            cursor = str(page["next_cursor"])
        assert len(seen) == 120 and seen == sorted(seen, reverse=True)

        for query in ("q=needle", "tag=vip", "queue=other", "state=available&kind=email&q=NEEDLE"):
            _, page = await call(f"{base}/api/jobs?{query}")
            assert [j["args_preview"] for j in page["jobs"]] == ['{"to":"needle@example.com"}']
        _, page = await call(f"{base}/api/jobs?state=completed")
        assert page["jobs"] == []


async def test_scan_window_bounds_each_page(client: awa.AsyncClient,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "SCAN_WINDOW", 10)
    needle = await client.insert(Email("needle@example.com"), queue="bulk")
    await client.insert_many_copy([Email(f"user{i}@example.com") for i in range(35)],
                                  queue="bulk")
    async with serving(ui_app(client=client)) as base:
        cursor, pages, found = "", 0, []
        while True:
            _, page = await call(f"{base}/api/jobs?q=needle&cursor={cursor}")
            pages += 1
            found += [j["id"] for j in page["jobs"]]
            if page["next_cursor"] is None:
                break
            cursor = str(page["next_cursor"])
        assert found == [needle.id]
        assert pages == 4  # 36 rows read ten at a time, never all at once


async def test_actions_and_refusals(client: awa.AsyncClient, database_url: str) -> None:
    s = await seed(client)
    await client.shutdown()  # nothing claims the retried job behind the test's back
    async with serving(ui_app(client=client)) as base:
        status, body = await call(f"{base}/api/jobs/{s.failed_id}/retry", {}, csrf=False)
        assert status == 403 and "X-Awa-Request" in body["error"]
        assert (await client.get_job(s.failed_id)).state is awa.JobState.Failed

        status, body = await call(f"{base}/api/jobs/{s.failed_id}/retry", {})
        assert status == 200 and body["state"] == "available"
        assert (await client.get_job(s.failed_id)).state is awa.JobState.Available

        assert (await call(f"{base}/api/queues/reports/pause", {}))[0] == 200
        pool = await client.pool()
        assert await pool.fetchval("SELECT paused FROM awa.queues WHERE queue = 'reports'")
        assert (await call(f"{base}/api/queues/reports/resume", {}))[0] == 200
        assert not await pool.fetchval("SELECT paused FROM awa.queues WHERE queue = 'reports'")

        status, body = await call(f"{base}/api/cron/nightly/trigger", {})
        assert status == 200 and (await client.get_job(body["job_id"])).kind == "report"
        assert (await call(f"{base}/api/cron/missing/pause", {}))[0] == 404

        status, body = await call(f"{base}/api/jobs?cursor=abc")
        assert status == 400 and body["field"] == "cursor"
        assert (await call(f"{base}/api/jobs?state=bogus"))[0] == 400
        assert (await call(f"{base}/api/jobs/999999"))[0] == 404
        status, body = await call(f"{base}/api/dlq/purge", {})
        assert status == 400 and body["field"] == "filter"


async def test_read_only_and_token(client: awa.AsyncClient, database_url: str) -> None:
    s = await seed(client)
    await client.shutdown()
    async with serving(ui_app(client=client, read_only=True)) as base:
        assert (await call(f"{base}/api/config"))[1]["read_only"] is True
        status, body = await call(f"{base}/api/jobs/{s.failed_id}/retry", {})
        assert status == 403 and "read-only" in body["error"]
        assert (await call(f"{base}/api/queues/email/drain", {}))[0] == 403
        assert (await call(f"{base}/api/overview"))[0] == 200
    assert (await client.get_job(s.failed_id)).state is awa.JobState.Failed
    assert (await client.get_job(s.available_id)).state is awa.JobState.Available

    # A database that refuses writes (as a replica does) turns read-only on by itself.
    replica_like = f"{database_url}?default_transaction_read_only=on"
    async with serving(ui_app(replica_like)) as base:
        assert (await call(f"{base}/api/config"))[1]["read_only"] is True
        assert (await call(f"{base}/api/jobs/{s.failed_id}/retry", {}))[0] == 403

    async with serving(ui_app(client=client, token="s3cret")) as base:
        assert (await call(f"{base}/api/overview"))[0] == 401
        assert (await call(f"{base}/api/overview", token="wrong"))[0] == 401
        assert (await call(f"{base}/api/queues/email/pause", {}))[0] == 401
        assert (await call(f"{base}/api/overview", token="s3cret"))[0] == 200
        _, cfg = await call(f"{base}/api/config")
        assert cfg["auth_required"] and not cfg["authorized"]
    assert not await (await client.pool()).fetchval(
        "SELECT coalesce(bool_or(paused), false) FROM awa.queues")


async def test_mounted_under_a_prefix(client: awa.AsyncClient) -> None:
    host = Starlette(routes=[Mount("/ops/awa", ui_app(client=client))])
    async with serving(host) as base:
        status, cfg = await call(f"{base}/ops/awa/api/config")
        assert status == 200 and cfg["read_only"] is False

        def fetch(path: str) -> tuple[str, str]:
            import urllib.request
            with urllib.request.urlopen(base + path) as resp:
                return resp.geturl(), resp.read().decode()
        import asyncio
        final, html = await asyncio.to_thread(fetch, "/ops/awa")
        assert final.endswith("/ops/awa/") and 'src="static/app.js"' in html
        _, js = await asyncio.to_thread(fetch, "/ops/awa/static/app.js")
        assert "function esc(" in js


async def test_runtime_role_without_write_rights_is_read_only(
        client: awa.AsyncClient, database_url: str) -> None:
    await client.insert(Email("x@example.com"))
    pool = await client.pool()
    role = "awa_ui_reader"
    await pool.execute(f"DROP ROLE IF EXISTS {role}")
    try:
        await pool.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'reader-pw'")
        await pool.execute(f"GRANT USAGE ON SCHEMA awa TO {role}")
        await pool.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {role}")
        parts = urlsplit(database_url)
        netloc = f"{role}:reader-pw@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        url = urlunsplit(parts._replace(netloc=netloc))
        async with serving(ui_app(url)) as base:
            assert (await call(f"{base}/api/config"))[1]["read_only"] is True
            status, page = await call(f"{base}/api/jobs")
            assert status == 200 and len(page["jobs"]) == 1
    finally:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {role}")
            await conn.execute(f"REVOKE ALL ON SCHEMA awa FROM {role}")
            await conn.execute(f"DROP ROLE {role}")
        finally:
            await conn.close()


async def test_awa_serve_subprocess(client: awa.AsyncClient, database_url: str) -> None:
    import asyncio
    import os
    import socket
    import subprocess
    import sys

    from tests.helpers import ROOT

    await client.insert(Email("a@example.com"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWA_UI_TOKEN": "tok"}
    proc = subprocess.Popen([sys.executable, "-m", "awa", "--database-url", database_url,
                             "serve", "--port", str(port), "--read-only"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async def up() -> bool:
            try:
                return (await call(f"{base}/api/config"))[0] == 200
            except OSError:
                await asyncio.sleep(0.1)
                return False
        await wait_until(up, timeout=30, message="awa serve to listen")
        _, cfg = await call(f"{base}/api/config", token="tok")
        assert cfg["read_only"] is True and cfg["auth_required"] is True
        assert (await call(f"{base}/api/jobs"))[0] == 401
        status, page = await call(f"{base}/api/jobs", token="tok")
        assert status == 200 and len(page["jobs"]) == 1
        assert (await call(f"{base}/api/queues/default/pause", {}, token="tok"))[0] == 403
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert b"Awa UI on http://127.0.0.1" in err


async def test_job_workflow_graph(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    run = await client.enqueue_workflow(awa.chord([Email("a@x"), Email("b@x")], Email("c@x")))
    a, b, callback = (j.id for j in run.jobs)
    async with serving(ui_app(client=client)) as base:
        status, wf = await call(f"{base}/api/jobs/{callback}/workflow")
        assert status == 200
        assert wf["layers"] == [[a, b], [callback]]
        last = wf["nodes"][-1]
        assert last["status"] == "waiting" and last["waiting_on"] == 2
        assert [e["parent_id"] for e in last["parents"]] == [a, b]
        plain = await client.insert(Email("d@x"))
        _, alone = await call(f"{base}/api/jobs/{plain.id}/workflow")
        assert [n["id"] for n in alone["nodes"]] == [plain.id] and alone["layers"] == [[plain.id]]
        status, _ = await call(f"{base}/api/jobs/987654/workflow")
        assert status == 404
