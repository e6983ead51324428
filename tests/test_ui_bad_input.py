"""The web UI's write endpoints and read parameters answer bad input with 4xx, never 500
(issue 28 item 5): malformed, deeply nested or mistyped bodies and parameters."""

from __future__ import annotations

from typing import Any

from tests.test_ui_safety import _raw
from tests.ui_helpers import call, seed, serving

import awa
from awa.web.ui import ui_app

_DEEP = b"[" * 100_000 + b"]" * 100_000
BAD_BODIES = [b"[]", b'"x"', b"1", b"null", b"true", b"{", b"\xff\xfe{}", b'{"a": NaN}',
              _DEEP, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b'{"kind": ' + _DEEP + b"}"]
BAD_VALUES: list[Any] = [1, 1.5, True, [], {}, [[[[1]]]], {"a": {"b": {}}}, "x" * 5000,
                         "\x00", None, -1, 10**30, 2**70, "NaN", "", [1, "a"],
                         {"max_rate": []}]
FIELDS = {
    "/api/jobs/retry-failed": ("kind", "queue"),
    "/api/queues/email/overrides": ("poll_interval_ms", "claim_batch_size", "rate_limit",
                                    "deadline_ms"),
    "/api/dlq/retry": ("kind", "queue", "tag"),
    "/api/dlq/purge": ("kind", "queue", "tag"),
    "/api/batches": ("op_kind", "priority", "target_queue", "queue", "kind", "tag", "state",
                     "ids", "created_after", "created_before"),
}
BAD_READS = (
    "/api/jobs?cursor=99999999999999999999999", "/api/jobs?cursor=-5", "/api/jobs?state=x",
    "/api/jobs?q=%00", "/api/jobs?queue=%00", "/api/jobs/99999999999999999999",
    "/api/jobs/-1", "/api/jobs/abc", "/api/dlq?cursor=x",
    "/api/dlq?cursor=99999999999999999999999", "/api/dlq?kind=%00", "/api/batches/zzz",
    "/api/batches/preview?op_kind=x", "/api/batches/preview?priority=abc",
    "/api/batches/preview?op_kind=set_priority&priority=2&ids=1,x",
    "/api/batches/preview?op_kind=set_priority&priority=2&created_after=bad")
JSON_POST = {"X-Awa-Request": "1", "Content-Type": "application/json"}


async def test_bad_input_never_gets_a_500(client: awa.AsyncClient) -> None:
    s = await seed(client)
    await client.shutdown()
    paths = [*FIELDS, f"/api/jobs/{s.failed_id}/retry", f"/api/jobs/{s.available_id}/cancel",
             "/api/queues/email/pause", "/api/queues/email/resume", "/api/queues/nope/drain",
             "/api/queues/email/overrides/clear", "/api/cron/nightly/pause",
             f"/api/dlq/{s.failed_id}/retry",
             "/api/batches/00000000-0000-0000-0000-000000000000/cancel"]
    failures: list[tuple[Any, ...]] = []
    async with serving(ui_app(client=client)) as base:
        for path in paths:
            for body in BAD_BODIES:
                status, _ = await _raw(base, "POST", path, body=body, headers=JSON_POST)
                if status >= 500:
                    failures.append((path, body[:10], status))
        for path, fields in FIELDS.items():
            for field in fields:
                for value in BAD_VALUES:
                    status, answer = await call(f"{base}{path}", {field: value})
                    if status >= 500 or not isinstance(answer, dict):
                        failures.append((path, field, repr(value)[:20], status, answer))
        for path in BAD_READS:
            status, answer = await call(f"{base}{path}")
            if status >= 500:
                failures.append((path, status, answer))
    assert failures == []
