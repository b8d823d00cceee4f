"""The sandbox itself, over real HTTP/1.1 and h2c: provider-shaped answers and its memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from sandbox_helpers import APNS_BODY, access_token, apns_headers, fcm, raw_exchange

from campaign_trigger.delivery.mapping import FCM_ERROR_TYPE
from campaign_trigger.delivery.sandbox_rules import SandboxState
from support import free_port


def test_apns_answers_over_http2_with_an_empty_body_and_the_apns_id(sandbox: str) -> None:
    apns_id = str(uuid.uuid4())
    with httpx.Client(http1=False, http2=True) as h2c:
        answer = h2c.post(
            f"{sandbox}/3/device/ok-h2", content=APNS_BODY, headers=apns_headers(apns_id=apns_id)
        )
        anonymous = h2c.post(f"{sandbox}/3/device/ok-h2", content=APNS_BODY)
    assert (answer.http_version, answer.status_code, answer.content) == ("HTTP/2", 200, b"")
    assert answer.headers["apns-id"] == apns_id
    assert (anonymous.status_code, anonymous.json()) == (403, {"reason": "MissingProviderToken"})
    uuid.UUID(anonymous.headers["apns-id"])  # generated when the request has none
    [delivery] = httpx.get(f"{sandbox}/sandbox/deliveries").json()
    assert (delivery["token"], delivery["message_id"], delivery["http_version"]) == (
        "ok-h2",
        apns_id,
        "2",
    )


def test_apns_over_http11_is_refused_as_an_http2_only_server_refuses_it(sandbox: str) -> None:
    port = int(sandbox.rsplit(":", 1)[1])
    request = (
        b"POST /3/device/ok-h11 HTTP/1.1\r\nHost: x\r\nauthorization: bearer x\r\n"
        b"apns-topic: t\r\ncontent-length: %d\r\n\r\n%s" % (len(APNS_BODY), APNS_BODY)
    )
    answer = raw_exchange(port, request)
    assert not answer.startswith(b"HTTP/")
    assert answer[3] == 0x4  # a SETTINGS frame: the server preface
    goaway = answer[answer.index(b"\x07\x00\x00\x00\x00\x00") - 3 :]
    assert goaway[9:17] == b"\x00\x00\x00\x00\x00\x00\x00\x01"  # last stream 0, PROTOCOL_ERROR
    assert b"HTTP/2" in goaway[17:]
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["requests"] == 0


def test_apns_errors_copy_apple_bodies(sandbox: str) -> None:
    with httpx.Client(http1=False, http2=True) as h2c:

        def send(token: str, body: bytes = APNS_BODY, **headers: str) -> httpx.Response:
            return h2c.post(
                f"{sandbox}/3/device/{token}", content=body, headers=apns_headers(**headers)
            )

        gone = send("unregistered-x")
        assert gone.status_code == 410
        assert gone.json()["reason"] == "Unregistered"
        assert abs(gone.json()["timestamp"] / 1000 - time.time()) < 60
        assert (send("invalid-x").status_code, send("invalid-x").json()) == (
            400,
            {"reason": "BadDeviceToken"},
        )
        assert send("expired-x").json() == {"reason": "ExpiredToken"}
        assert send("mismatch-x").json() == {"reason": "DeviceTokenNotForTopic"}
        big = send("ok-x", b'{"aps":{},"x":"' + b"x" * 4100 + b'"}')
        assert (big.status_code, big.json()) == (413, {"reason": "PayloadTooLarge"})
        bad_id = send("ok-x", apns_id="not-a-uuid")
        assert (bad_id.status_code, bad_id.json()) == (400, {"reason": "BadMessageId"})
        assert send("ok-x", b"").json() == {"reason": "PayloadEmpty"}
        assert send("ok-x", b"[1]").json() == {"reason": "PayloadEmpty"}
        assert send("ok-x", apns_priority="7").json() == {"reason": "BadPriority"}
        assert send("ok-x", apns_push_type="loud").json() == {"reason": "InvalidPushType"}
        assert send("ok-x", apns_expiration="soon").json() == {"reason": "BadExpirationDate"}
        assert send("fail-x").status_code == 500
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0


def test_fcm_answers_copy_google_bodies(sandbox: str) -> None:
    bearer = access_token(sandbox)
    note = {"notification": {"title": "T", "body": "B"}}
    ok = fcm(sandbox, bearer, {"token": "ok-f", **note})
    assert ok.status_code == 200
    assert ok.json()["name"].startswith("projects/p/messages/0:")
    gone = fcm(sandbox, bearer, {"token": "unregistered-f", **note})
    error = gone.json()["error"]
    assert (gone.status_code, error["code"], error["status"]) == (404, 404, "NOT_FOUND")
    assert error["details"] == [{"@type": FCM_ERROR_TYPE, "errorCode": "UNREGISTERED"}]
    bad = fcm(sandbox, bearer, {"token": "invalid-f", **note}).json()["error"]
    assert (bad["status"], bad["details"][0]["errorCode"]) == (
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
    )
    assert fcm(sandbox, bearer, {"token": "fail-f", **note}).status_code == 500
    mismatch = fcm(sandbox, bearer, {"token": "mismatch-f", **note}).json()["error"]
    assert mismatch["details"][0]["errorCode"] == "SENDER_ID_MISMATCH"
    data = fcm(sandbox, bearer, {"token": "ok-f", "data": {"n": 12}}).json()["error"]
    assert data["message"] == "Invalid value at 'message.data[0].value' (TYPE_STRING), 12"
    nobody = fcm(sandbox, bearer, note).json()["error"]
    assert nobody["message"] == "Recipient of the message is not set."
    huge = fcm(sandbox, bearer, {"token": "ok-f", "data": {"x": "y" * 4100}})
    assert huge.json() == {
        "error": {
            "code": 400,
            "message": "Request contains an invalid argument.",
            "status": "INVALID_ARGUMENT",
        }
    }
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 1


def test_flaky_and_throttled_fail_once_per_token_and_message_then_succeed(sandbox: str) -> None:
    bearer = access_token(sandbox)
    first = fcm(sandbox, bearer, {"token": "flaky-f"})
    assert (first.status_code, first.headers["retry-after"]) == (503, "1")
    assert first.json()["error"]["details"][0]["errorCode"] == "UNAVAILABLE"
    assert fcm(sandbox, bearer, {"token": "flaky-f"}).status_code == 200
    throttled = fcm(sandbox, bearer, {"token": "throttled-f"})
    assert throttled.json()["error"]["details"][0]["errorCode"] == "QUOTA_EXCEEDED"
    assert fcm(sandbox, bearer, {"token": "throttled-f"}).status_code == 200
    headers = apns_headers(apns_id=str(uuid.uuid4()))
    with httpx.Client(http1=False, http2=True) as h2c:
        first = h2c.post(f"{sandbox}/3/device/flaky-a", content=APNS_BODY, headers=headers)
        assert (first.status_code, first.headers["retry-after"]) == (503, "1")
        again = h2c.post(f"{sandbox}/3/device/flaky-a", content=APNS_BODY, headers=headers)
    assert again.status_code == 200


def test_deliveries_stats_and_clear(sandbox: str, sandbox_state: SandboxState) -> None:
    with httpx.Client(http1=False, http2=True) as h2c:
        for token, collapse in (("ok-s1", "c1"), ("ok-s1", "c1"), ("ok-s2", None)):
            extra = {"apns_collapse_id": collapse} if collapse else {}
            h2c.post(
                f"{sandbox}/3/device/{token}", content=APNS_BODY, headers=apns_headers(**extra)
            )
    [one, _] = httpx.get(f"{sandbox}/sandbox/deliveries", params={"token": "ok-s1"}).json()
    assert (one["title"], one["body"], one["data"]) == ("T", "B", {"request_id": "r"})
    assert one["collapse_id"] == "c1"
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token"] == {"ok-s1": 2, "ok-s2": 1}
    assert stats["per_token_collapse"] == {"ok-s1": {"c1": 2}, "ok-s2": {"": 1}}
    assert sandbox_state.per_token_collapse == stats["per_token_collapse"]
    assert sorted(stats["per_message"].values()) == [1, 1, 1]
    assert httpx.delete(f"{sandbox}/sandbox/deliveries").status_code == 200
    assert httpx.get(f"{sandbox}/sandbox/deliveries").json() == []
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["per_token"] == {}


def test_latency_setting_delays_provider_answers(sandbox: str) -> None:
    assert httpx.put(f"{sandbox}/sandbox/config", json={"latency_ms": 300}).status_code == 200
    assert httpx.get(f"{sandbox}/sandbox/config").json() == {"latency_ms": 300}
    try:
        started = time.monotonic()
        with httpx.Client(http1=False, http2=True) as h2c:
            h2c.post(f"{sandbox}/3/device/ok-slow", content=APNS_BODY, headers=apns_headers())
        assert time.monotonic() - started >= 0.3
    finally:
        httpx.put(f"{sandbox}/sandbox/config", json={"latency_ms": 0})
    refused = httpx.put(f"{sandbox}/sandbox/config", json={"latency": 1})
    assert (refused.status_code, refused.json()) == (
        400,
        {"error_message": "unknown settings: latency"},
    )


@pytest.fixture
def sandbox_process(closed_port: int) -> Iterator[str]:
    """``campaign-trigger sandbox`` in a child process (same CT_HOME: same service keys)."""
    tls_port = free_port()
    env = {
        **os.environ,
        "CT_SANDBOX_PORT": str(closed_port),
        "CT_SANDBOX_TLS_PORT": str(tls_port),
    }
    child = subprocess.Popen([sys.executable, "-m", "campaign_trigger.cli", "sandbox"], env=env)
    url = f"http://127.0.0.1:{closed_port}"
    try:
        deadline = time.monotonic() + 90  # imports are slow on a busy machine
        while True:
            try:
                httpx.get(f"{url}/sandbox/stats")
                break
            except httpx.TransportError:
                assert child.poll() is None, "sandbox process exited"
                assert time.monotonic() < deadline, "sandbox did not start"
                time.sleep(0.1)
        yield url
    finally:
        child.terminate()
        child.wait(15)


def test_the_cli_runs_the_sandbox_until_terminated(sandbox_process: str) -> None:
    with httpx.Client(http1=False, http2=True) as h2c:
        answer = h2c.post(
            f"{sandbox_process}/3/device/ok-cli", content=APNS_BODY, headers=apns_headers()
        )
    assert answer.status_code == 200
    assert httpx.get(f"{sandbox_process}/sandbox/stats").json()["per_token"] == {"ok-cli": 1}


def test_an_h2c_upgrade_offer_is_declined_and_the_request_answered_in_http11(
    sandbox: str,
) -> None:
    port = int(sandbox.rsplit(":", 1)[1])
    body = b'{"latency_ms": 0}'
    offer = (
        b"PUT /sandbox/config HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )  # what curl --http2 sends for a PUT to an http:// URL
    answer = raw_exchange(port, offer + b"GET /sandbox/stats HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'{"latency_ms":0.0}' in answer
    assert answer.count(b"HTTP/1.1 200 OK") == 2
