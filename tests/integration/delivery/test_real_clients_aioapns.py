"""aioapns, a client nobody here wrote, against the sandbox over TLS: every outcome.

Nothing is patched but where it connects (its APNs host and port); it trusts the sandbox's
CA through the SSL context it accepts, as it would trust a corporate proxy's."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aioapns import APNs, NotificationRequest, PushType
from aioapns.connection import APNsProductionClientProtocol, APNsTLSClientProtocol
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.credentials import apns_credentials

ALERT = {"aps": {"alert": {"title": "Hi", "body": "There"}}}


@pytest.fixture
async def apns_client(
    sandbox_ports: tuple[int, int], sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[APNs]:
    monkeypatch.setattr(APNsProductionClientProtocol, "APNS_SERVER", "localhost")
    monkeypatch.setattr(APNsTLSClientProtocol, "APNS_PORT", sandbox_ports[1])
    credentials = apns_credentials(get_settings())
    client = APNs(
        key=credentials.private_key,
        key_id=credentials.key_id,
        team_id=credentials.team_id,
        topic="com.example.app",
        ssl_context=ssl.create_default_context(cafile=credentials.ca_file),
    )
    yield client
    for connection in list(client.pool.connections):
        connection.close()


async def send(client: APNs, token: str, **options: Any) -> tuple[str, str | None]:
    request = NotificationRequest(
        device_token=token, message=options.pop("message", ALERT), **options
    )
    result = await client.send_notification(request)
    assert result.notification_id == request.notification_id
    return result.status, result.description


async def test_aioapns_over_tls_gets_every_outcome(apns_client: APNs, sandbox: str) -> None:
    outcomes = {
        token: await send(apns_client, token)
        for token in (
            "ok-aio",
            "unregistered-aio",
            "expired-aio",
            "invalid-aio",
            "mismatch-aio",
            "fail-aio",
            "throttled-aio",
            "expiredprovidertoken-aio",
        )
    }
    assert outcomes == {
        "ok-aio": ("200", None),
        "unregistered-aio": ("410", "Unregistered"),
        "expired-aio": ("410", "ExpiredToken"),
        "invalid-aio": ("400", "BadDeviceToken"),
        "mismatch-aio": ("400", "DeviceTokenNotForTopic"),
        "fail-aio": ("500", "InternalServerError"),
        "throttled-aio": ("429", "TooManyRequests"),
        "expiredprovidertoken-aio": ("403", "ExpiredProviderToken"),
    }
    retried = str(uuid.uuid4())
    assert await send(apns_client, "flaky-aio", notification_id=retried) == (
        "503",
        "ServiceUnavailable",
    )
    assert await send(apns_client, "flaky-aio", notification_id=retried) == ("200", None)
    big = {"aps": {"alert": "x"}, "pad": "p" * 4100}
    assert await send(apns_client, "ok-aio-big", message=big) == ("413", "PayloadTooLarge")
    voip = {"aps": {}, "pad": "p" * 5000}
    assert await send(apns_client, "ok-aio-voip", message=voip, push_type=PushType.VOIP) == (
        "200",
        None,
    )
    assert await send(apns_client, "ok-aio", collapse_key="c" * 65) == ("400", "BadCollapseId")
    assert await send(apns_client, "ok-aio", collapse_key="req-1:dev-1") == ("200", None)
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token"] == {"ok-aio": 2, "flaky-aio": 1, "ok-aio-voip": 1}
    assert stats["per_token_collapse"]["ok-aio"] == {"": 1, "req-1:dev-1": 1}
    deliveries = httpx.get(f"{sandbox}/sandbox/deliveries").json()
    assert {d["http_version"] for d in deliveries} == {"2"}


async def test_aioapns_with_a_key_apple_does_not_know_is_refused(
    sandbox_ports: tuple[int, int], sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(APNsProductionClientProtocol, "APNS_SERVER", "localhost")
    monkeypatch.setattr(APNsTLSClientProtocol, "APNS_PORT", sandbox_ports[1])
    stranger = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    client = APNs(
        key=stranger.decode(),
        key_id="STRANGER01",
        team_id="SANDBOXTEAM",
        topic="com.example.app",
        ssl_context=ssl.create_default_context(cafile=apns_credentials(get_settings()).ca_file),
    )
    try:
        assert await send(client, "ok-stranger") == ("403", "InvalidProviderToken")
    finally:
        for connection in list(client.pool.connections):
            connection.close()
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0
