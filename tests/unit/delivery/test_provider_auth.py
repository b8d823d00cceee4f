"""Provider credentials: JWT shapes, reuse windows, access-token caching, endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from campaign_trigger.config import Settings
from campaign_trigger.delivery.auth import (
    JWT_BEARER,
    ApnsProviderTokens,
    AuthRefused,
    AuthUnavailable,
    GoogleAccessTokens,
)
from campaign_trigger.delivery.credentials import (
    APNS_HOST,
    FCM_HOST,
    CredentialsError,
    apns_credentials,
    fcm_credentials,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_without_credentials_the_sandbox_and_throwaway_keys_are_used() -> None:
    settings = Settings(sandbox_port=9999)
    fcm = fcm_credentials(settings)
    apns = apns_credentials(settings)
    assert fcm.base_url == apns.base_url == "http://127.0.0.1:9999"
    assert fcm.token_uri == "http://127.0.0.1:9999/token"
    assert "PRIVATE KEY" in fcm.private_key
    assert "PRIVATE KEY" in apns.private_key
    assert "PRIVATE KEY" not in repr(fcm) + repr(apns)


def test_with_credentials_files_the_real_hosts_are_used(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    p8 = tmp_path / "AuthKey.p8"
    p8.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    sa = tmp_path / "sa.json"
    sa.write_text(
        json.dumps(
            {
                "client_email": "x@p.iam",
                "private_key": "k",
                "project_id": "p1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    settings = Settings(
        fcm_credentials_file=str(sa),
        apns_key_file=str(p8),
        apns_key_id="KEY1",
        apns_team_id="TEAM1",
    )
    fcm = fcm_credentials(settings)
    assert (fcm.base_url, fcm.token_uri, fcm.project_id) == (
        FCM_HOST,
        "https://oauth2.googleapis.com/token",
        "p1",
    )
    assert apns_credentials(settings).base_url == APNS_HOST
    with pytest.raises(CredentialsError):
        apns_credentials(Settings(apns_key_file=str(p8)))  # key id and team id missing
    with pytest.raises(CredentialsError):
        fcm_credentials(Settings(fcm_credentials_file=str(tmp_path / "missing.json")))


def test_apns_jwt_is_es256_with_kid_and_iss_and_reused_within_its_window() -> None:
    clock = Clock()
    tokens = ApnsProviderTokens(
        apns_credentials(Settings(apns_key_id="K1", apns_team_id="T1")),
        reuse_seconds=30 * 60,
        clock=clock,
    )
    first = tokens.get()
    assert jwt.get_unverified_header(first) == {"alg": "ES256", "kid": "K1", "typ": "JWT"}
    assert jwt.decode(first, options={"verify_signature": False}) == {
        "iss": "T1",
        "iat": int(clock.now),
    }
    clock.now += 29 * 60
    assert tokens.get() == first
    clock.now += 60
    assert tokens.get() != first
    assert tokens.minted == 2


def test_apns_jwt_renewal_only_replaces_the_stale_token() -> None:
    tokens = ApnsProviderTokens(apns_credentials(Settings()), clock=Clock())
    stale = tokens.get()
    fresh = tokens.renew(stale)
    assert fresh != stale
    assert tokens.renew(stale) == fresh  # a second stream with the old token: no new mint
    assert tokens.minted == 2


def test_apns_jwt_renewed_within_the_same_second_is_not_dated_in_the_future() -> None:
    clock = Clock()
    tokens = ApnsProviderTokens(apns_credentials(Settings()), clock=clock)
    stale = tokens.get()
    for _ in range(3):
        fresh = tokens.renew(tokens.get())
        assert jwt.decode(fresh, options={"verify_signature": False})["iat"] <= clock.now
    assert fresh != stale


@pytest.mark.parametrize("seconds", [60, 19 * 60, 61 * 60])
def test_apns_jwt_reuse_outside_20_to_60_minutes_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match="20 to 60"):
        ApnsProviderTokens(apns_credentials(Settings()), reuse_seconds=seconds)


async def test_access_tokens_are_fetched_once_and_refreshed_near_expiry() -> None:
    grants: list[dict[str, str]] = []

    def token_endpoint(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        grants.append(form)
        return httpx.Response(
            200,
            json={"access_token": f"t{len(grants)}", "expires_in": 3600, "token_type": "Bearer"},
        )

    clock = Clock()
    async with httpx.AsyncClient(transport=httpx.MockTransport(token_endpoint)) as client:
        tokens = GoogleAccessTokens(
            fcm_credentials(Settings()), client=client, clock=clock, refresh_margin_seconds=300
        )
        assert [await tokens.get() for _ in range(5)] == ["t1"] * 5
        clock.now += 3300 - 1
        assert await tokens.get() == "t1"
        clock.now += 1
        assert await tokens.get() == "t2"
        tokens.invalidate("t2")
        assert await tokens.get() == "t3"
    assert grants[0]["grant_type"] == JWT_BEARER
    claims = jwt.decode(grants[0]["assertion"], options={"verify_signature": False})
    assert claims["iat"] == 1_800_000_000
    assert claims["exp"] == claims["iat"] + 3600


@pytest.mark.parametrize(
    ("status", "error"), [(400, AuthRefused), (401, AuthRefused), (503, AuthUnavailable)]
)
async def test_token_endpoint_failures_are_told_apart(status: int, error: type[Exception]) -> None:
    transport = httpx.MockTransport(lambda _: httpx.Response(status, json={"error": "x"}))
    async with httpx.AsyncClient(transport=transport) as client:
        tokens = GoogleAccessTokens(fcm_credentials(Settings()), client=client)
        with pytest.raises(error):
            await tokens.get()
