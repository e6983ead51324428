"""Web UI safety: Host allow-list, body cap, safe links, no 500s, large values cut."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tests.ui_helpers import call, serving

import awa
from awa.web.ui import ui_app
from awa.web.ui.data import DETAIL_VALUE_MAX

APP_JS = Path(__file__).resolve().parent.parent / "src/awa/web/ui/static/app.js"


async def _raw(base: str, method: str, path: str, *, host: str | None = None,
               body: bytes | None = None, headers: dict[str, str] | None = None,
               chunked: bool = False) -> tuple[int, Any]:
    """One HTTP request with full control of Host, length and body."""
    parts = urlsplit(base)

    def go() -> tuple[int, Any]:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or parts.netloc)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None and chunked:
            conn.putheader("Transfer-Encoding", "chunked")
        elif body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if body is not None:
            if chunked:
                for i in range(0, len(body), 65536):
                    piece = body[i:i + 65536]
                    conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                conn.send(b"0\r\n\r\n")
            else:
                conn.send(body)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data) if data.startswith((b"{", b"[")) else data
    return await asyncio.to_thread(go)


async def test_only_bound_host_names_without_a_token(database_url: str) -> None:
    async with serving(ui_app(database_url)) as base:
        port = urlsplit(base).port
        for host in ("evil.example", f"evil.example:{port}", "attacker.test:80"):
            status, body = await _raw(base, "GET", "/api/overview", host=host)
            assert status == 400 and "host name is not allowed" in body["error"]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
            assert (await _raw(base, "GET", "/api/overview", host=host))[0] == 200, host
    async with serving(ui_app(database_url, allowed_hosts=["ui.example"])) as base:
        assert (await _raw(base, "GET", "/api/overview", host="ui.example"))[0] == 200
        assert (await _raw(base, "GET", "/api/overview", host="127.0.0.1"))[0] == 400
    async with serving(ui_app(database_url, token="t0k")) as base:  # a token stops rebinding
        status, _ = await _raw(base, "GET", "/api/overview", host="evil.example")
        assert status == 401
        status, _ = await _raw(base, "GET", "/api/overview", host="ui.example",
                               headers={"Authorization": "Bearer t0k"})
        assert status == 200


async def test_bodies_over_the_cap_get_413(database_url: str) -> None:
    big = b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    async with serving(ui_app(database_url)) as base:
        for chunked in (False, True):
            status, body = await _raw(base, "POST", "/api/queues/q/pause", body=big,
                                      chunked=chunked, headers={"X-Awa-Request": "1"})
            assert status == 413 and "body over" in body["error"]
        status, _ = await _raw(base, "POST", "/api/queues/q/pause", body=b"{}",
                               headers={"X-Awa-Request": "1"})
        assert status == 200
    async with serving(ui_app(database_url, max_body_bytes=10)) as base:
        status, _ = await _raw(base, "POST", "/api/queues/q/pause", body=b'{"a": "0123456789"}',
                               headers={"X-Awa-Request": "1"})
        assert status == 413


async def test_bad_override_bodies_are_400(database_url: str) -> None:
    async with serving(ui_app(database_url)) as base:
        url = f"{base}/api/queues/q/overrides"
        for body in ({"nope": 1}, {"updated_by": 5}, {"rate_limit": [1, 2, 3]},
                     {"poll_interval_ms": "fast"}, [1, 2]):
            status, answer = await call(url, body)
            assert status == 400 and "error" in answer, (body, status, answer)
        deep = b'{"a":' * 3000 + b"1" + b"}" * 3000
        status, answer = await _raw(base, "POST", "/api/queues/q/overrides", body=deep,
                                    headers={"X-Awa-Request": "1",
                                             "Content-Type": "application/json"})
        assert status == 400 and "nested too deeply" in answer["error"]
        assert (await call(url, {"poll_interval_ms": 200}))[0] == 200


async def test_docs_url_must_be_http(client: awa.AsyncClient) -> None:
    for bad in ("javascript:alert(1)", "JavaScript:alert(1)", " javascript:x", "data:text/html,x",
                "//evil.example", "http:/x"):
        with pytest.raises(awa.ValidationError) as err:
            client.queue_descriptor("q", docs_url=bad)
        assert err.value.field == "docs_url"
    client.queue_descriptor("q", docs_url="https://wiki.example/q")


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's JS")
def test_the_page_links_only_http_urls() -> None:
    source = APP_JS.read_text()
    start = source.index("function webUrl(")
    fn = source[start:source.index("\n", start)]
    script = fn + """
const cases = ["https://a.example", "http://a", "javascript:alert(1)", " JAVASCRIPT:x",
               "data:text/html,x", "", null, 5, "https:", "//evil"];
console.log(JSON.stringify(cases.map(webUrl)));"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [True, True, False, False, False, False, False, False,
                                      False, False]


async def test_large_values_are_cut_with_a_way_to_the_whole(client: awa.AsyncClient,
                                                            database_url: str) -> None:
    job = await client.insert({"blob": "x" * 300_000}, kind="k", metadata={"m": "y" * 100})
    async with serving(ui_app(client=client)) as base:
        status, detail = await call(f"{base}/api/jobs/{job.id}")
        assert status == 200 and detail["truncated"] == {"args": 300_011}
        assert isinstance(detail["job"]["args"], str)
        assert len(detail["job"]["args"]) <= DETAIL_VALUE_MAX // 4 + 1
        assert detail["job"]["metadata"] == {"m": "y" * 100}
        status, whole = await call(f"{base}/api/jobs/{job.id}?full=1")
        assert whole["truncated"] == {} and whole["job"]["args"] == {"blob": "x" * 300_000}


def _js_function(source: str, header: str) -> str:
    """The text of the page's top-level function starting with ``header``."""
    start = source.index(header)
    return source[start:source.index("\n}\n", start) + 2]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's JS")
def test_the_runtime_page_escapes_what_workers_published() -> None:
    """runtime_instances.queues is written by any role with that table: its
    names and values were rendered as HTML (stored XSS, issue 40)."""
    source = APP_JS.read_text()
    helpers = source[source.index("function esc("):source.index("const stateChip")]
    slots = _js_function(source, "function queueSlots(") if "function queueSlots(" in source \
        else ""
    script = helpers + slots + _js_function(source, "async function runtimeView(") + """
const state = { countCap: 100000 };
const bad = "<img src=x onerror=alert(1)>";
const worker = (queues, extra) => ({ instance_id: "i", hostname: "h", pid: 1, queues,
  stale: false, is_leader: false, in_flight: 0, claimed: 0, completed: 0, listening: true,
  started_at: null, last_seen_at: null, ...extra });
const pages = [
  [worker({ [bad]: { in_flight: bad, max_workers: "<b>x</b>" } })],
  [worker(null, { pid: bad, in_flight: bad }), worker(bad), worker([bad]), worker({ q: null })]];
let api;
(async () => {
  const out = [];
  for (const workers of pages) {
    api = async () => ({ leader: null, workers });
    out.push(await runtimeView().catch((e) => "threw " + e));
  }
  console.log(JSON.stringify(out));
})();"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    hostile, odd = json.loads(out.stdout)
    assert "<img" not in hostile and "<b>" not in hostile, hostile
    assert hostile.count("&lt;img src=x onerror=alert(1)&gt;") == 2
    assert not odd.startswith("threw") and "<img" not in odd, odd  # not an object: as JSON
