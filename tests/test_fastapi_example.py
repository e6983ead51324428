"""examples/fastapi_app.py under uvicorn: the lifespan opens the client, runs the
worker in-process and mounts the UI; a request enqueues, the worker runs it."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from tests.helpers import ROOT, wait_until
from tests.ui_helpers import call, serving

pytest.importorskip("fastapi")


def _load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # FastAPI resolves the routes' annotations through it
    spec.loader.exec_module(module)
    return module


async def test_fastapi_example(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    example = _load_example("fastapi_app_under_test")
    try:
        async with serving(example.app, lifespan=True) as base:
            status, body = await call(f"{base}/signup?email=a@example.com", {})
            assert status == 200, body
            assert body["queue"] == "email"

            async def done() -> Any:
                _, job = await call(f"{base}/jobs/{body['job_id']}")
                return job if job["state"] == "completed" else None
            job = await wait_until(done, message="the job to complete")
            assert job["output"] == {"sent_to": "a@example.com"}
            assert await _status(f"{base}/awa/") == 200  # the UI page itself

            status, config = await call(f"{base}/awa/api/config")
            assert status == 200 and config["read_only"] is False
            assert example.client.runtime is not None  # the worker runs in-process
        assert example.client.runtime is None  # shut down with the app
    finally:
        sys.modules.pop("fastapi_app_under_test", None)
        await example.client.close()


async def _status(url: str) -> int:
    def get() -> int:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
    return await asyncio.to_thread(get)


async def test_lifespan_composes_with_the_apps_own(database_url: str) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import awa
    from awa.contrib.starlette import awa_client, awa_lifespan

    seen: list[str] = []

    @asynccontextmanager
    async def mine(app: Any) -> AsyncIterator[None]:
        seen.append("start")
        yield
        seen.append("stop")

    async def count(request: Request) -> JSONResponse:
        stats = await awa_client(request).queue_stats()
        return JSONResponse({"queues": len(stats)})

    client = awa.AsyncClient(database_url)
    app = Starlette(routes=[Route("/count", count)], lifespan=awa_lifespan(client, then=mine))
    async with serving(app, lifespan=True) as base:
        status, body = await call(f"{base}/count")
        assert status == 200 and body == {"queues": 0}
        assert client.runtime is None  # worker=False: enqueue-only
        assert await _status(f"{base}/awa/") == 404  # ui=None: not mounted
    assert seen == ["start", "stop"]
    with pytest.raises(ValueError, match="below the root"):
        awa_lifespan(client, ui="/")
