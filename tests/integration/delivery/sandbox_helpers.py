"""Credentials and requests for the sandbox tests, made with the service's own sandbox keys
(the ones ``campaign-trigger`` signs with in sandbox mode), imported by name."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import jwt

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.auth import FCM_SCOPE, JWT_BEARER
from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials

APNS_BODY = b'{"aps":{"alert":{"title":"T","body":"B"}},"request_id":"r"}'


def provider_jwt(*, issued_at: float | None = None, key: Any = None, kid: str = "") -> str:
    """An APNs provider JWT signed by the service's sandbox key (or ``key`` as ``kid``)."""
    credentials = apns_credentials(get_settings())
    return jwt.encode(
        {"iss": credentials.team_id, "iat": int(issued_at or time.time())},
        key or credentials.private_key,
        algorithm="ES256",
        headers={"kid": kid or credentials.key_id},
    )


def apns_headers(token: str | None = None, **extra: str) -> dict[str, str]:
    """What an APNs request carries."""
    return {
        "authorization": f"bearer {token or provider_jwt()}",
        "apns-topic": "com.example.app",
        "apns-push-type": "alert",
        **{name.replace("_", "-"): value for name, value in extra.items()},
    }


def assertion(url: str, **claims: Any) -> str:
    """A JWT-bearer assertion for ``url``'s token route, signed by the service's key."""
    credentials = fcm_credentials(get_settings())
    now = int(time.time())
    base = {
        "iss": credentials.client_email,
        "scope": FCM_SCOPE,
        "aud": f"{url}/token",
        "iat": now,
        "exp": now + 3600,
    }
    key = claims.pop("key", credentials.private_key)
    kid = claims.pop("kid", credentials.private_key_id)
    return jwt.encode({**base, **claims}, key, algorithm="RS256", headers={"kid": kid})


def token_answer(url: str, grant: str) -> httpx.Response:
    """The token route's answer to ``grant``."""
    return httpx.post(f"{url}/token", data={"grant_type": JWT_BEARER, "assertion": grant})


def access_token(url: str) -> str:
    """A bearer token issued by the sandbox to the service's account."""
    answer = token_answer(url, assertion(url))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["token_type"], body["expires_in"]) == ("Bearer", 3599)
    return str(body["access_token"])


def fcm(url: str, bearer: str, message: dict[str, Any], **request: Any) -> httpx.Response:
    """``POST messages:send`` over HTTP/1.1."""
    return httpx.post(
        f"{url}/v1/projects/p/messages:send",
        json={"message": message, **request},
        headers={"authorization": f"Bearer {bearer}"},
    )


def raw_exchange(port: int, data: bytes, *, read_for: float = 1.0) -> bytes:
    """Send raw bytes to the sandbox and return all it writes back until it closes or
    ``read_for`` seconds pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_for) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received
