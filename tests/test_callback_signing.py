"""Signed callback requests (v2): the signature covers action, id, body and expiry."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tests.helpers import TO_MUTABLE
from tests.test_callbacks import _post

import awa
from awa.core import callback_contract as cc

SECRET = bytes(range(32))
#: The worked example of docs/security.md ("Signed callback requests").
EXAMPLE = dict(action="complete", callback_id="550e8400-e29b-41d4-a716-446655440000",
               body=b'{"payload":{"status":"paid"}}', expires=1767225600)
EXAMPLE_SIGNATURE = "v2=89601c634a1b70dcb522409fbb891ecfd7227e4ab49dfa6d1dedc7fa110c7ff5"


@dataclass
class Pay:
    n: int


async def _waiting(client: awa.AsyncClient) -> tuple[int, str]:
    job = await client.insert(Pay(1))
    cid = str(uuid.uuid4())
    pool = await client.pool()
    await pool.execute(TO_MUTABLE, job.id)  # setup: to awa.jobs
    await pool.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                       "callback_id = $2, heartbeat_at = NULL WHERE id = $1", job.id,
                       uuid.UUID(cid))
    return job.id, cid


def _signed(action: str, cid: str, body: bytes, *, ttl: int = 300,
            secret: bytes = SECRET) -> dict[str, str]:
    return cc.sign_request(secret, action, cid, body, int(time.time()) + ttl)


def test_documented_example_is_what_the_code_computes() -> None:
    headers = cc.sign_request(SECRET, **EXAMPLE)  # type: ignore[arg-type]
    assert headers == {"X-Awa-Signature": EXAMPLE_SIGNATURE,
                       "X-Awa-Signature-Expires": "1767225600"}
    with open("docs/security.md", encoding="utf-8") as doc:
        text = doc.read()
    assert EXAMPLE_SIGNATURE.removeprefix("v2=") in text and "1767225600" in text
    assert cc.verify_request(SECRET, "complete", EXAMPLE["callback_id"],  # type: ignore[arg-type]
                             EXAMPLE["body"], headers, now=1767225000) is None  # type: ignore[arg-type]


async def test_a_captured_signature_cannot_be_replayed(client: awa.AsyncClient) -> None:
    app = awa.web.callback_app(client, secret=SECRET)
    job_id, cid = await _waiting(client)
    heartbeat = b'{"timeout_seconds": 60}'
    captured = _signed("heartbeat", cid, heartbeat)
    assert (await _post(app, f"/api/callbacks/{cid}/heartbeat", heartbeat, captured))[0] == 200
    forged = b'{"payload": {"forged": true}}'
    attempts: list[tuple[str, bytes, Any]] = [
        ("complete", forged, captured),                               # other action and body
        ("heartbeat", b'{"timeout_seconds": 99999}', captured),       # same action, new body
        ("complete", forged, _signed("resume", cid, forged)),         # signed for another action
        ("complete", forged, _signed("complete", str(uuid.uuid4()), forged)),  # another id
        ("complete", forged, _signed("complete", cid, forged, secret=b"x" * 32)),
        ("complete", forged, _signed("complete", cid, forged, ttl=-5)),        # expired
        ("complete", forged, _signed("complete", cid, forged, ttl=10 * 86400)),  # too far
        ("complete", forged, {**_signed("complete", cid, forged),
                              "X-Awa-Signature-Expires": "soon"}),
        ("complete", forged, {"X-Awa-Signature": _signed("complete", cid, forged)[
            "X-Awa-Signature"]}),                                     # no expiry
        ("complete", forged, cc.sign(SECRET, cid)),                   # legacy, not opted in
        ("complete", forged, None),
    ]
    for action, body, headers in attempts:
        status, answer = await _post(app, f"/api/callbacks/{cid}/{action}", body, headers)
        assert status == 401 and answer["error"].startswith("signature refused"), (action,
                                                                                    answer)
    assert (await client.get_job(job_id)).state is awa.JobState.WaitingExternal
    body = b'{"payload": {"status": "paid"}}'
    status, answer = await _post(app, f"/api/callbacks/{cid}/complete", body,
                                 _signed("complete", cid, body))
    assert status == 200 and answer["state"] == "completed"
    assert (await client.get_job(job_id)).state is awa.JobState.Completed


async def test_legacy_signatures_only_with_the_opt_in(client: awa.AsyncClient) -> None:
    strict = awa.web.callback_app(client, secret=SECRET)
    legacy = awa.web.callback_app(client, secret=SECRET, accept_legacy_signatures=True)
    _, cid = await _waiting(client)
    old = cc.sign(SECRET, cid)
    assert (await _post(strict, f"/api/callbacks/{cid}/heartbeat", b"{}", old))[0] == 401
    assert (await _post(legacy, f"/api/callbacks/{cid}/heartbeat", b"{}", old))[0] == 200
    body = b"{}"
    assert (await _post(legacy, f"/api/callbacks/{cid}/heartbeat", body,
                        _signed("heartbeat", cid, body)))[0] == 200  # v2 works there too


async def test_bad_bodies_never_get_a_500(client: awa.AsyncClient) -> None:
    app = awa.web.callback_app(client)
    _, cid = await _waiting(client)
    bodies = [b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
              b'{"payload": ' + b"[" * 1000 + b"]" * 1000 + b"}", b"[1, 2]", b'"text"', b"\xff\xfe",
              json.dumps({"payload": "x" * (1024 * 1024)}).encode()]
    for body in bodies:
        status, answer = await _post(app, f"/api/callbacks/{cid}/complete", body)
        assert status in (400, 413, 422) and "error" in answer, (body[:20], status)
    for timeout in ('"10"', "true", "-1", "1e400", "NaN", "null", "[1]"):
        status, answer = await _post(app, f"/api/callbacks/{cid}/heartbeat",
                                     f'{{"timeout_seconds": {timeout}}}'.encode())
        assert status == 400 and "error" in answer, (timeout, status, answer)
    for error in ("5", "null", '{"a": 1}'):
        status, _ = await _post(app, f"/api/callbacks/{cid}/fail", f'{{"error": {error}}}'.encode())
        assert status == 400


async def test_an_unreachable_database_is_503() -> None:
    down = awa.AsyncClient("postgresql://postgres@127.0.0.1:1/none")  # connects lazily
    app = awa.web.callback_app(down)
    status, answer = await _post(app, f"/api/callbacks/{uuid.uuid4()}/complete", b"{}")
    await down.close()
    assert status == 503 and answer == {"error": "database unavailable"}


async def test_an_expiry_of_non_ascii_digits_is_refused_not_a_500(
        client: awa.AsyncClient) -> None:
    """'²'.isdigit() is true but int('²') raises: that was a pre-auth 500 (issue 40)."""
    app = awa.web.callback_app(client, secret=SECRET)
    job_id, cid = await _waiting(client)
    body = b'{"payload": {}}'
    for expires in ("\u00b2", "1\u00b2", "\u00b9\u00b2\u00b3", "\u0661\u0662"):
        headers = {**_signed("complete", cid, body), "X-Awa-Signature-Expires": expires}
        assert cc.verify_request(SECRET, "complete", cid, body, headers) \
            == "missing or malformed X-Awa-Signature-Expires"
        if all(ord(c) < 256 for c in expires):  # what a header can carry
            status, answer = await _post(app, f"/api/callbacks/{cid}/complete", body, headers,
                                         encoding="latin-1")
            assert status == 401 and "malformed" in answer["error"], answer
    assert (await client.get_job(job_id)).state is awa.JobState.WaitingExternal
