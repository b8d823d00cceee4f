"""The sandbox itself, over real HTTP/1.1 and h2c: provider-shaped answers and its memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from campaign_trigger.delivery.auth import JWT_BEARER
from campaign_trigger.delivery.mapping import FCM_ERROR_TYPE

KEY = ec.generate_private_key(ec.SECP256R1())
PROVIDER_JWT = jwt.encode(
    {"iss": "TEAM", "iat": int(time.time())}, KEY, algorithm="ES256", headers={"kid": "KEY1"}
)
APNS_HEADERS = {
    "authorization": f"bearer {PROVIDER_JWT}",
    "apns-topic": "com.example.app",
    "apns-push-type": "alert",
}
APNS_BODY = b'{"aps":{"alert":{"title":"T","body":"B"}},"request_id":"r"}'


def access_token(client: httpx.Client, url: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"iss": "a@b", "scope": "s", "aud": f"{url}/token", "iat": now, "exp": now + 3600}
    assertion = jwt.encode(claims, key, algorithm="RS256")
    answer = client.post(f"{url}/token", data={"grant_type": JWT_BEARER, "assertion": assertion})
    assert answer.status_code == 200
    body = answer.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] > 3000
    return str(body["access_token"])


def fcm(client: httpx.Client, url: str, token: str, bearer: str) -> httpx.Response:
    return client.post(
        f"{url}/v1/projects/p/messages:send",
        json={"message": {"token": token, "notification": {"title": "T", "body": "B"}}},
        headers={"authorization": f"Bearer {bearer}"},
    )


def test_apns_route_speaks_http2_prior_knowledge_and_http11(sandbox: str) -> None:
    with httpx.Client(http1=False, http2=True) as h2c:
        answer = h2c.post(f"{sandbox}/3/device/ok-h2", content=APNS_BODY, headers=APNS_HEADERS)
        assert answer.http_version == "HTTP/2"
    assert answer.status_code == 200
    uuid.UUID(answer.headers["apns-id"])
    apns_id = str(uuid.uuid4())
    answer = httpx.post(
        f"{sandbox}/3/device/ok-h11",
        content=APNS_BODY,
        headers={**APNS_HEADERS, "apns-id": apns_id},
    )
    assert answer.http_version == "HTTP/1.1"
    assert (answer.status_code, answer.headers["apns-id"]) == (200, apns_id)
    versions = {
        d["token"]: d["http_version"] for d in httpx.get(f"{sandbox}/sandbox/deliveries").json()
    }
    assert versions == {"ok-h2": "2", "ok-h11": "1.1"}


def test_apns_errors_copy_apple_bodies(sandbox: str) -> None:
    gone = httpx.post(f"{sandbox}/3/device/unregistered-x", content=APNS_BODY, headers=APNS_HEADERS)
    assert gone.status_code == 410
    assert gone.json()["reason"] == "Unregistered"
    assert abs(gone.json()["timestamp"] / 1000 - time.time()) < 60
    bad = httpx.post(f"{sandbox}/3/device/invalid-x", content=APNS_BODY, headers=APNS_HEADERS)
    assert (bad.status_code, bad.json()) == (400, {"reason": "BadDeviceToken"})
    big = httpx.post(f"{sandbox}/3/device/ok-x", content=b"x" * 5000, headers=APNS_HEADERS)
    assert (big.status_code, big.json()) == (413, {"reason": "PayloadTooLarge"})
    anonymous = httpx.post(f"{sandbox}/3/device/ok-x", content=APNS_BODY)
    assert (anonymous.status_code, anonymous.json()) == (403, {"reason": "MissingProviderToken"})
    headers = {**APNS_HEADERS, "apns-id": "not-a-uuid"}
    bad_id = httpx.post(f"{sandbox}/3/device/ok-x", content=APNS_BODY, headers=headers)
    assert (bad_id.status_code, bad_id.json()) == (400, {"reason": "BadMessageId"})
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0


def test_fcm_answers_copy_google_bodies(sandbox: str) -> None:
    with httpx.Client() as client:
        bearer = access_token(client, sandbox)
        ok = fcm(client, sandbox, "ok-f", bearer)
        assert ok.status_code == 200
        assert ok.json()["name"].startswith("projects/p/messages/")
        gone = fcm(client, sandbox, "unregistered-f", bearer)
        assert gone.status_code == 404
        error = gone.json()["error"]
        assert (error["code"], error["status"]) == (404, "NOT_FOUND")
        assert error["details"] == [{"@type": FCM_ERROR_TYPE, "errorCode": "UNREGISTERED"}]
        bad = fcm(client, sandbox, "invalid-f", bearer).json()["error"]
        assert bad["status"] == "INVALID_ARGUMENT"
        assert bad["details"][0]["errorCode"] == "INVALID_ARGUMENT"
        assert fcm(client, sandbox, "fail-f", bearer).status_code == 500
        unknown = fcm(client, sandbox, "ok-f", "ya29.forged")
        assert (unknown.status_code, unknown.json()["error"]["status"]) == (401, "UNAUTHENTICATED")
        grant = client.post(f"{sandbox}/token", data={"grant_type": "password"})
        assert (grant.status_code, grant.json()["error"]) == (400, "unsupported_grant_type")


def test_flaky_fails_once_per_token_and_message_then_succeeds(sandbox: str) -> None:
    with httpx.Client() as client:
        bearer = access_token(client, sandbox)
        first = fcm(client, sandbox, "flaky-f", bearer)
        assert (first.status_code, first.headers["retry-after"]) == (503, "1")
        assert first.json()["error"]["details"][0]["errorCode"] == "UNAVAILABLE"
        assert fcm(client, sandbox, "flaky-f", bearer).status_code == 200
    apns_id = str(uuid.uuid4())
    headers = {**APNS_HEADERS, "apns-id": apns_id}
    first = httpx.post(f"{sandbox}/3/device/flaky-a", content=APNS_BODY, headers=headers)
    assert (first.status_code, first.headers["retry-after"]) == (503, "1")
    again = httpx.post(f"{sandbox}/3/device/flaky-a", content=APNS_BODY, headers=headers)
    assert again.status_code == 200


def test_deliveries_stats_and_clear(sandbox: str) -> None:
    for token in ("ok-s1", "ok-s1", "ok-s2"):
        httpx.post(f"{sandbox}/3/device/{token}", content=APNS_BODY, headers=APNS_HEADERS)
    [one, _] = httpx.get(f"{sandbox}/sandbox/deliveries", params={"token": "ok-s1"}).json()
    assert (one["title"], one["body"], one["data"]) == ("T", "B", {"request_id": "r"})
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token"] == {"ok-s1": 2, "ok-s2": 1}
    assert sorted(stats["per_message"].values()) == [1, 1, 1]
    assert httpx.delete(f"{sandbox}/sandbox/deliveries").status_code == 200
    assert httpx.get(f"{sandbox}/sandbox/deliveries").json() == []
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["per_token"] == {}


def test_latency_setting_delays_provider_answers(sandbox: str) -> None:
    assert httpx.put(f"{sandbox}/sandbox/config", json={"latency_ms": 300}).status_code == 200
    try:
        started = time.monotonic()
        httpx.post(f"{sandbox}/3/device/ok-slow", content=APNS_BODY, headers=APNS_HEADERS)
        assert time.monotonic() - started >= 0.3
    finally:
        httpx.put(f"{sandbox}/sandbox/config", json={"latency_ms": 0})


@pytest.fixture
def sandbox_process(closed_port: int) -> Iterator[str]:
    """``serve()`` as the CLI runs it, in a child process."""
    code = (
        "from campaign_trigger.delivery.sandbox import serve; "
        f"serve(host='127.0.0.1', port={closed_port}, latency_ms=0)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    url = f"http://127.0.0.1:{closed_port}"
    try:
        deadline = time.monotonic() + 30
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
        child.wait(10)


def test_serve_runs_the_sandbox_until_terminated(sandbox_process: str) -> None:
    with httpx.Client(http1=False, http2=True) as h2c:
        answer = h2c.post(
            f"{sandbox_process}/3/device/ok-cli", content=APNS_BODY, headers=APNS_HEADERS
        )
    assert answer.status_code == 200
    assert httpx.get(f"{sandbox_process}/sandbox/stats").json()["per_token"] == {"ok-cli": 1}
