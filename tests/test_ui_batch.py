"""The web UI's Batches page: its JSON API, and the page in a real headless Chromium.

The browser tests skip, with the reason, when no Chromium is installed (as in
``test_ui_browser.py``); the API tests always run.
"""

from __future__ import annotations

from typing import Any

from tests.browser import open_view, shot
from tests.helpers import FAST, idle_task, wait_until
from tests.ui_helpers import Email, call, serving

import awa
from awa.web.ui import ui_app


async def test_batch_api_preview_submit_cancel(client: awa.AsyncClient) -> None:
    jobs = [await client.insert(Email(f"u{i}@example.com"), queue="bulk", tags=["t"])
            for i in range(12)]
    async with serving(ui_app(client=client)) as base:
        assert (await call(f"{base}/api/batches"))[1] == {"operations": []}
        status, p = await call(f"{base}/api/batches/preview?op_kind=set_priority&priority=1"
                               "&queue=bulk&tag=t&state=available")
        assert status == 200 and p["total_matched"] == 12 and len(p["sample"]) == 10
        assert p["sample"][0] == {**p["sample"][0], "id": jobs[0].id, "queue": "bulk"}
        _, p = await call(f"{base}/api/batches/preview?op_kind=move_queue&target_queue=x"
                          f"&ids={jobs[0].id},{jobs[1].id}")
        assert p["total_matched"] == 2

        for query, field in (("op_kind=set_priority&priority=one&queue=bulk", "priority"),
                             ("op_kind=set_priority&priority=7&queue=bulk", "priority"),
                             ("op_kind=move_queue&queue=bulk", "queue"),
                             ("op_kind=set_priority&priority=1&ids=1;2", "ids"),
                             ("op_kind=set_priority&priority=1&state=running", "filter.state"),
                             ("op_kind=drop&queue=bulk", "op_kind")):
            status, body = await call(f"{base}/api/batches/preview?{query}")
            assert status == 400 and body["field"] == field, (query, body)

        body = {"op_kind": "move_queue", "target_queue": "other", "priority": "3",
                "queue": "bulk", "tag": " "}
        status, refused = await call(f"{base}/api/batches", body, csrf=False)
        assert status == 403 and "X-Awa-Request" in refused["error"]
        status, refused = await call(f"{base}/api/batches", {"op_kind": "set_priority",
                                                             "priority": 1, "queue": ""})
        assert status == 400 and refused["field"] == "filter"
        assert "requires a filter" in refused["error"]
        assert (await call(f"{base}/api/batches"))[1] == {"operations": []}

        status, made = await call(f"{base}/api/batches", body)
        assert status == 200 and made["ok"]
        op = made["operation"]
        assert op["state"] == "pending" and op["submitted_by"] == "web-ui"
        assert op["spec"] == {"op_kind": "move_queue", "queue": "other", "priority": 3}
        assert op["filter"]["queue"] == "bulk" and op["filter"]["tag"] is None
        _, listed = await call(f"{base}/api/batches")
        assert [o["id"] for o in listed["operations"]] == [op["id"]]
        assert (await call(f"{base}/api/batches/{op['id']}"))[1] == op
        assert (await call(f"{base}/api/batches/not-a-uuid"))[0] == 400

        status, cancelled = await call(f"{base}/api/batches/{op['id']}/cancel", {})
        assert status == 200 and cancelled["operation"]["state"] == "cancelling"
        status, again = await call(f"{base}/api/batches/{op['id']}/cancel", {})
        assert status == 200 and again["operation"]["state"] == "cancelling"
    assert {(await client.get_job(j.id)).queue for j in jobs} == {"bulk"}


async def test_batch_api_read_only_and_token(client: awa.AsyncClient) -> None:
    await client.insert(Email("a@example.com"), queue="bulk")
    body = {"op_kind": "set_priority", "priority": 1, "queue": "bulk"}
    async with serving(ui_app(client=client, read_only=True)) as base:
        assert (await call(f"{base}/api/batches"))[0] == 200
        assert (await call(f"{base}/api/batches/preview?op_kind=set_priority&priority=1"))[0] \
            == 200  # a preview writes nothing
        status, refused = await call(f"{base}/api/batches", body)
        assert status == 403 and "read-only" in refused["error"]
    op = await client.set_priority(2, filter={"queue": "bulk"})
    async with serving(ui_app(client=client, read_only=True)) as base:
        assert (await call(f"{base}/api/batches/{op['id']}/cancel", {}))[0] == 403
    async with serving(ui_app(client=client, token="tok")) as base:
        assert (await call(f"{base}/api/batches"))[0] == 401
        assert (await call(f"{base}/api/batches", body))[0] == 401
        assert (await call(f"{base}/api/batches", body, token="tok"))[0] == 200
    assert [o["state"] for o in await client.list_batch_operations()] == ["pending", "pending"]


async def test_batches_page_preview_submit_and_cancel(client: awa.AsyncClient,
                                                      page: Any) -> None:
    jobs = [await client.insert(Email(f"u{i}@example.com"), queue="bulk") for i in range(20)]
    waiting = await client.set_priority(4, filter={"queue": "<b>nowhere</b>"}, submitted_by="ops")
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/batches", "batches")
        row = f'#batches tr[data-batch="{waiting["id"]}"]'
        assert "priority → 4" in await page.inner_text(row)
        assert "queue=<b>nowhere</b>" in await page.inner_text(row)  # shown, never markup
        await page.click(f'{row} button[data-action="batch-cancel"]')
        await page.wait_for_selector(f"{row} >> text=cancelling")  # the leader finalises it

        await page.select_option('#batch-form select[name="op_kind"]', "move_queue")
        await page.wait_for_selector('#batch-form input[name="target_queue"]')
        await page.fill('#batch-form input[name="target_queue"]', "elsewhere")
        await page.fill('#batch-form input[name="queue"]', "bulk")
        await page.click('#batch-form button[value="preview"]')
        await page.wait_for_selector("#batch-preview >> text=20")
        assert "20 queued jobs match" in await page.inner_text("#batch-preview")
        assert await page.locator("#batch-preview tr").count() == 11  # header + 10 samples
        await page.screenshot(path=shot("batches-preview"), full_page=True)

        idle_task(client, "idle")
        await client.start([("idle", 1)], **FAST, batch_interval_ms=50)
        await page.click('#batch-form button[value="submit"]')
        await page.wait_for_selector("#batches >> text=queue → elsewhere")
        await page.wait_for_selector("#batches tr:nth-child(2) >> text=completed",
                                     timeout=20_000)
        assert "20 / 20" in await page.inner_text("#batches tr:nth-child(2)")
        await page.screenshot(path=shot("batches"), full_page=True)
    await client.shutdown()
    assert {(await client.get_job(j.id)).queue for j in jobs} == {"elsewhere"}
    ops = await client.list_batch_operations()
    assert ops[0]["submitted_by"] == "web-ui" and ops[0]["processed"] == 20


async def test_batches_page_read_only(client: awa.AsyncClient, page: Any) -> None:
    await client.insert(Email("a@example.com"), queue="bulk")
    await client.set_priority(1, filter={"queue": "bulk"})
    async with serving(ui_app(client=client, read_only=True)) as base:
        await open_view(page, f"{base}/#/batches", "batches")
        await page.wait_for_selector("#batches")
        assert await page.locator("#batch-form").count() == 0
        assert await page.locator("button[data-action]").count() == 0
    await wait_until(lambda: _pending(client), message="the operation to stay pending")


async def _pending(client: awa.AsyncClient) -> bool:
    return [o["state"] for o in await client.list_batch_operations()] == ["pending"]
