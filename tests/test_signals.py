"""Test signals: a worker's claim loops, completer and services announce what they did,
and a test awaits the event instead of sleeping (`awa.telemetry.signals`)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tests.helpers import FAST, wait_for_state

import awa
from awa.telemetry import signals as hooks
from awa.telemetry.signals import Signals


def test_nothing_is_recorded_without_a_listener() -> None:
    assert hooks.hub is None
    hooks.emit("claim", queue="q", jobs=1)  # a None check, nothing else
    with hooks.listening() as heard:
        hooks.emit("claim", queue="q", jobs=1)
    hooks.emit("claim", queue="q", jobs=2)
    assert [(s.name, s.data) for s in heard.history] == [("claim", {"queue": "q", "jobs": 1})]


async def test_an_event_from_another_thread_wakes_the_waiter(signals: Signals) -> None:
    waiting = asyncio.create_task(signals.wait("claim", queue="q", count=2))
    await asyncio.sleep(0)  # the waiter has taken its mark
    threads = [threading.Thread(target=hooks.emit, args=("claim",), kwargs={"queue": q,
                                                                          "jobs": n})
               for n, q in enumerate(["other", "q", "q"])]
    for thread in threads:
        thread.start()
        thread.join()
    got = await asyncio.wait_for(waiting, timeout=10)
    assert got.data == {"queue": "q", "jobs": 2}


async def test_a_wait_that_times_out_says_what_it_heard(signals: Signals) -> None:
    hooks.emit("flush", batch=[])
    with pytest.raises(AssertionError, match=r"'pass' signal.*heard: \['flush'\]"):
        await signals.wait("pass", service="promote", timeout=0.1)


async def test_a_worker_announces_claims_passes_and_completions(client: awa.AsyncClient,
                                                                 signals: Signals) -> None:
    @client.task(kind="k", queue="q")
    async def handle(job: awa.Job) -> None:
        return None

    job = await client.insert({"a": 1}, kind="k", queue="q")
    await client.start([("q", 2)], **FAST)
    try:
        await wait_for_state(client, job.id, awa.JobState.Completed)
        assert (await signals.outcome(job.id)).name == "flush"
        claimed = await signals.wait("claim", queue="q", since=0, where=lambda s: s.data["jobs"])
        assert claimed.data["jobs"] == 1
        begun = time.monotonic()
        promoted = await signals.pass_after("promote")
        assert promoted.data["started"] >= begun
    finally:
        await client.shutdown()
    await signals.wait("stopped", queue="q", since=0)
