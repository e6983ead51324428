"""The web UI in a real headless Chromium (Debian's ``chromium`` package).

Skipped, with the reason, when no Chromium is installed; ``.ci/run`` installs
it. Screenshots go to ``build/ui-screenshots/`` and are listed at the end of
the test run.
"""

from __future__ import annotations

from typing import Any

from tests.browser import open_view, shot
from tests.helpers import wait_until
from tests.ui_helpers import Email, seed, serving

import awa
from awa.web.ui import ui_app


async def test_every_page_with_real_data(client: awa.AsyncClient, page: Any) -> None:
    s = await seed(client)
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/", "dashboard")
        await page.wait_for_function(  # outcome counts are flushed about once a second
            "document.querySelector('#counts .card:last-child .n').textContent !== '0'")
        assert "does not exist" in await page.inner_text("main")
        await page.screenshot(path=shot("dashboard"), full_page=True)

        await open_view(page, f"{base}/#/jobs?state=failed", "jobs")
        assert await page.locator("#jobs tr").count() == 2  # header + the failed job
        await page.click(f'a[href="#/jobs/{s.failed_id}"]')
        await page.wait_for_selector('main[data-view="job"] #timeline')
        assert "TerminalError" in await page.inner_text("#timeline")
        await page.screenshot(path=shot("job-failed"), full_page=True)

        await open_view(page, f"{base}/#/jobs/{s.waiting_id}", "job")
        # The previous page was a job page too, so open_view can return before this
        # job has rendered: wait for its callback line (fails after 5 s if it never shows).
        await page.wait_for_function(
            "document.querySelector('#callback')?.innerText"
            ".startsWith('waiting for callback #1')", timeout=5000)
        await open_view(page, f"{base}/#/jobs/{s.completed_id}", "job")
        # Job page to job page again: wait for this job's output (5 s), not the last page's.
        await page.wait_for_function(
            "document.querySelector('main')?.innerText.includes('delivered')", timeout=5000)

        await open_view(page, f"{base}/#/queues", "queues")
        assert await page.locator('#queues tr[data-queue="reports"]').count() == 1
        await open_view(page, f"{base}/#/cron", "cron")
        assert "0 3 * * *" in await page.inner_text("#cron")
        await open_view(page, f"{base}/#/runtime", "runtime")
        await page.wait_for_selector("#workers >> text=leader", timeout=10_000)
        await open_view(page, f"{base}/#/dlq", "dlq")
        assert "No jobs match" in await page.inner_text("main")

        # Dark theme, remembered across reloads.
        await page.click("#theme")
        await page.reload()
        await page.wait_for_selector('main[data-view="dlq"]')
        assert await page.evaluate("document.documentElement.dataset.theme") == "dark"
        await open_view(page, f"{base}/#/", "dashboard")
        await page.screenshot(path=shot("dashboard-dark"), full_page=True)
    await client.shutdown()


async def test_retry_a_failed_job_and_pause_a_queue(client: awa.AsyncClient, page: Any) -> None:
    s = await seed(client)
    await client.shutdown()  # keep the retried job where the test can see it
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/jobs/{s.failed_id}", "job")
        await page.click('#job-actions button[data-action="job-retry"]')
        await wait_until(lambda: _state_is(client, s.failed_id, awa.JobState.Available),
                         message="the UI's retry to reach the database")
        await page.wait_for_function("document.querySelector('h1 .state').textContent"
                                     " === 'available'")

        await open_view(page, f"{base}/#/queues", "queues")
        await page.click('tr[data-queue="reports"] button[data-action="queue-pause"]')
        pool = await client.pool()
        await wait_until(lambda: pool.fetchval(
            "SELECT paused FROM awa.queues WHERE queue = 'reports'"), message="pause")
        await page.wait_for_selector('tr[data-queue="reports"] button[data-action="queue-resume"]')


async def _state_is(client: awa.AsyncClient, job_id: int, state: awa.JobState) -> bool:
    return (await client.get_job(job_id)).state is state


async def test_live_updates_without_reload(client: awa.AsyncClient, page: Any) -> None:
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/", "dashboard")
        assert (await page.inner_text("#counts .card >> nth=0")).startswith("0")
        await page.evaluate("window.__sameDocument = true")
        await client.insert_many_copy([Email(f"u{i}@example.com") for i in range(3)])
        await page.wait_for_function(
            "document.querySelector('#counts .card .n').textContent === '3'", timeout=10_000)
        assert await page.evaluate("window.__sameDocument") is True  # no reload happened


async def test_read_only_hides_and_refuses(client: awa.AsyncClient, page: Any) -> None:
    s = await seed(client)
    await client.shutdown()
    async with serving(ui_app(client=client, read_only=True)) as base:
        for url, view in ((f"#/jobs/{s.failed_id}", "job"), ("#/queues", "queues"),
                          ("#/cron", "cron"), ("#/jobs?state=failed", "jobs"), ("#/dlq", "dlq")):
            await open_view(page, f"{base}/{url}", view)
            assert await page.locator("button[data-action]").count() == 0, url
        assert await page.is_visible("#mode")
        status = await page.evaluate(
            """async (id) => (await fetch(`api/jobs/${id}/retry`, {method: 'POST',
                 headers: {'x-awa-request': '1'}})).status""", s.failed_id)
        assert status == 403
    assert (await client.get_job(s.failed_id)).state is awa.JobState.Failed


async def test_access_token_login(client: awa.AsyncClient, page: Any) -> None:
    await client.insert(Email("a@example.com"))
    async with serving(ui_app(client=client, token="open-sesame")) as base:
        await page.goto(f"{base}/#/jobs")
        await page.wait_for_selector("#login")
        await page.fill("#login input", "wrong")
        await page.click("#login button")
        await page.wait_for_selector("text=That token was not accepted")
        await page.fill("#login input", "open-sesame")
        await page.click("#login button")
        await page.wait_for_selector('main[data-view="jobs"] #jobs')


async def test_queue_override_and_descriptors(client: awa.AsyncClient, page: Any) -> None:
    client.queue_descriptor("email", display_name="Email", owner="growth")
    s = await seed(client)
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/queues", "queues")
        assert "growth" in await page.inner_text('#queue-meta tr[data-queue="email"]')
        await page.select_option("#override-form select", "email")
        await page.fill('#override-form input[name="claim_batch_size"]', "5000")
        await page.click("#override-form button")
        await page.wait_for_selector("#toast.bad")  # refused: names the field
        assert "claim_batch_size" in await page.inner_text("#toast")
        await page.fill('#override-form input[name="claim_batch_size"]', "3")
        await page.fill('#override-form input[name="rate_limit"]', "20/4")
        await page.click("#override-form button")
        await page.wait_for_selector("#toast >> text=overrides of email saved")
        await page.wait_for_selector('#queue-meta tr[data-queue="email"] >> text=batch 3')
        runtime: Any = client._runtime
        await wait_until(lambda: _is(runtime.dispatchers["email"].cfg.claim_batch_size, 3),
                         timeout=10, message="the running worker to apply the override")
        await page.click('#queue-meta button[data-action="override-clear"]')
        await wait_until(lambda: _no_overrides(client), message="overrides cleared")
    assert s.failed_id > 0
    await client.shutdown()


async def _is(value: Any, expected: Any) -> bool:
    return bool(value == expected)


async def _no_overrides(client: awa.AsyncClient) -> bool:
    return await client.queue_overrides() == []


async def test_dlq_page_retry_and_purge(client: awa.AsyncClient, page: Any) -> None:
    s = await seed(client)
    await client.shutdown()
    assert await client.move_failed_to_dlq(s.failed_id, reason="bounced") is not None
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/dlq?queue=email", "dlq")
        assert "bounced" in await page.inner_text("#jobs")
        await page.click(f'a[href="#/jobs/{s.failed_id}"]')
        await page.wait_for_selector('#job-actions button[data-action="dlq-retry"]')
        assert "bounced" in await page.inner_text("main")
        await page.click('#job-actions button[data-action="dlq-retry"]')
        await wait_until(lambda: _state_is(client, s.failed_id, awa.JobState.Available),
                         message="the DLQ retry to reach the database")
        assert await client.dlq_depth() == 0


async def test_job_page_draws_its_workflow(client: awa.AsyncClient, page: Any) -> None:
    run = await client.enqueue_workflow(awa.chain(Email("a@x"),
                                                  awa.group(Email("b@x"), Email("c@x")),
                                                  Email("d@x")))
    first, last = run.jobs[0].id, run.jobs[-1].id
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/jobs/{last}", "job")
        await page.wait_for_selector("#workflow")
        assert await page.locator("#workflow .wf-layer").count() == 3
        assert await page.locator("#workflow .wf-node").count() == 4
        assert "Waiting for 2 parent job(s)" in await page.inner_text("#waiting-on")
        assert "when its parents finish" in await page.inner_text("main")
        await page.screenshot(path=shot("job-workflow"), full_page=True)
        await page.click(f'#workflow a[href="#/jobs/{first}"]')
        await page.wait_for_selector(f'#workflow .wf-node.current[data-job="{first}"]')


async def test_queues_page_shows_saturated_keys(client: awa.AsyncClient, page: Any) -> None:
    """Keys in flight on the queues page, the saturated one first and flagged."""
    from awa.db.queries import queries

    await client.enqueue_many_copy([{"n": i} for i in range(5)], kind="sync",
                                   concurrency_key="tenant-a", max_in_flight=2)
    await client.enqueue_many_copy([{"n": 0}], kind="sync", concurrency_key="tenant-b",
                                   max_in_flight=10)
    pool = await client.pool()
    await pool.fetch(queries()["attempt_claim_keyed"], "default", 32, 0.0, 0.0, "", 500)
    async with serving(ui_app(client=client)) as base:
        await open_view(page, f"{base}/#/queues", "queues")
        await page.wait_for_selector("#keys")
        rows = page.locator("#keys tr[data-key]")
        assert await rows.count() == 2
        first = await rows.nth(0).inner_text()
        assert "tenant-a" in first and "2 / 2" in first and "saturated" in first
        second = await rows.nth(1).inner_text()
        assert "tenant-b" in second and "1 / 10" in second and "saturated" not in second
        await page.screenshot(path=shot("queues-keys"), full_page=True)
