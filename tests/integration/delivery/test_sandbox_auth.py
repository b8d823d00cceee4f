"""The sandbox checks every credential against the keys it knows, as Apple and Google do:
each refusal, with the providers' status and wording."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sandbox_helpers import (
    APNS_BODY,
    access_token,
    apns_headers,
    assertion,
    fcm,
    provider_jwt,
    token_answer,
)

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox_rules import SandboxState

SHORT_LIVED = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def apns(sandbox: str, token: str, device: str = "ok-auth") -> httpx.Response:
    with httpx.Client(http1=False, http2=True) as h2c:
        return h2c.post(
            f"{sandbox}/3/device/{device}", content=APNS_BODY, headers=apns_headers(token)
        )


@pytest.mark.parametrize(
    ("why", "make"),
    [
        ("a forged signature", lambda: provider_jwt(key=ec.generate_private_key(ec.SECP256R1()))),
        (
            "an unknown kid",
            lambda: provider_jwt(key=ec.generate_private_key(ec.SECP256R1()), kid="NOPE123456"),
        ),
        ("an iat an hour ahead", lambda: provider_jwt(issued_at=time.time() + 3600)),
        ("not a JWT", lambda: "not-a-jwt"),
        (
            "HS256",
            lambda: jwt.encode(
                {"iss": "SANDBOXTEAM", "iat": int(time.time())},
                "s" * 32,
                headers={"kid": "SANDBOXKEY"},
            ),
        ),
    ],
)
def test_a_bad_provider_token_is_invalid_provider_token(
    sandbox: str, why: str, make: object
) -> None:
    answer = apns(sandbox, make())  # type: ignore[operator]
    assert (answer.status_code, answer.json()) == (403, {"reason": "InvalidProviderToken"}), why
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0


def test_a_provider_token_over_an_hour_old_is_expired_and_a_fresh_one_passes(sandbox: str) -> None:
    stale = apns(sandbox, provider_jwt(issued_at=time.time() - 3601))
    assert (stale.status_code, stale.json()) == (403, {"reason": "ExpiredProviderToken"})
    assert apns(sandbox, provider_jwt(issued_at=time.time() - 3500)).status_code == 200


def test_a_registered_apns_key_is_known_and_bound_to_its_team(sandbox: str, tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    mine = jwt.encode(
        {"iss": "TEAMID0001", "iat": int(time.time())},
        key,
        algorithm="ES256",
        headers={"kid": "KEYID00001"},
    )
    assert apns(sandbox, mine).json() == {"reason": "InvalidProviderToken"}  # not yet known
    registered = httpx.post(
        f"{sandbox}/sandbox/keys",
        json={"kind": "apns", "key_id": "KEYID00001", "team_id": "TEAMID0001", "pem": pem(key)},
    )
    assert registered.status_code == 201
    assert registered.json()["public_key"].startswith("-----BEGIN PUBLIC KEY-----")
    assert "PRIVATE" not in registered.text
    assert apns(sandbox, mine).status_code == 200
    other_team = jwt.encode(
        {"iss": "TEAMID0002", "iat": int(time.time())},
        key,
        algorithm="ES256",
        headers={"kid": "KEYID00001"},
    )
    assert apns(sandbox, other_team).json() == {"reason": "InvalidProviderToken"}
    listed = {(k["kind"], k["key_id"]) for k in httpx.get(f"{sandbox}/sandbox/keys").json()}
    assert {("apns", "KEYID00001"), ("apns", "SANDBOXKEY")} <= listed
    stored = (get_settings().home / "sandbox-keys.json").read_text()
    assert "KEYID00001" in stored
    assert "PRIVATE" not in stored


def test_a_key_registration_that_makes_no_sense_is_refused(sandbox: str) -> None:
    rsa_pem = pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    cases = [
        ({"kind": "apns", "key_id": "K", "pem": rsa_pem}, "an APNs key must be an EC P-256 key"),
        ({"kind": "google", "key_id": "K", "pem": "garbage"}, "not a PEM key"),
        ({"kind": "email", "key_id": "K", "pem": rsa_pem}, "kind must be 'apns' or 'google'"),
        ({"kind": "google", "key_id": "", "pem": rsa_pem}, "key_id must be 1 to 128 characters"),
    ]
    for body, why in cases:
        answer = httpx.post(f"{sandbox}/sandbox/keys", json=body)
        assert answer.status_code == 400
        assert answer.json()["error_message"].startswith(why)


def test_the_service_keys_are_kept_in_ct_home_owner_only() -> None:
    home = get_settings().home
    for name in ("sandbox-fcm-key.pem", "sandbox-apns-key.p8"):
        assert (home / name).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("why", "claims", "error", "description"),
    [
        (
            "forged",
            {"key": rsa.generate_private_key(public_exponent=65537, key_size=2048)},
            "invalid_grant",
            "Invalid JWT Signature.",
        ),
        ("unknown kid", {"kid": "0" * 40}, "invalid_grant", "Invalid JWT Signature."),
        (
            "another account",
            {"iss": "someone@else.iam.gserviceaccount.com"},
            "invalid_grant",
            "Invalid JWT Signature.",
        ),
        (
            "wrong aud",
            {"aud": "https://example.com/token"},
            "invalid_grant",
            "Invalid JWT: Failed audience check.",
        ),
        ("two hours", {"exp": 7200}, "invalid_grant", SHORT_LIVED),
        (
            "expired",
            {"iat": -3600, "exp": -10},
            "invalid_grant",
            SHORT_LIVED,
        ),
        (
            "future",
            {"iat": 600, "exp": 1200},
            "invalid_grant",
            SHORT_LIVED,
        ),
        (
            "no scope",
            {"scope": ""},
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.",
        ),
    ],
)
def test_a_bad_assertion_is_refused_as_google_refuses_it(
    sandbox: str,
    sandbox_state: SandboxState,
    why: str,
    claims: dict[str, Any],
    error: str,
    description: str,
) -> None:
    # Times are seconds from now, resolved here: collection can precede this test by minutes.
    now = int(time.time())
    at = {name: now + value if name in ("iat", "exp") else value for name, value in claims.items()}
    issued = len(sandbox_state.access_tokens)
    answer = token_answer(sandbox, assertion(sandbox, **at))
    assert answer.status_code == 400, why
    assert answer.json() == {"error": error, "error_description": description}, why
    assert len(sandbox_state.access_tokens) == issued


def test_googles_own_token_uri_is_an_accepted_audience(sandbox: str) -> None:
    answer = token_answer(sandbox, assertion(sandbox, aud="https://oauth2.googleapis.com/token"))
    assert answer.status_code == 200


def test_sends_need_a_live_access_token_with_a_messaging_scope(
    sandbox: str, sandbox_state: SandboxState
) -> None:
    message = {"token": "ok-bearer"}
    for bearer in ("ya29.forged", "Basic"):
        refused = fcm(sandbox, bearer, message)
        assert refused.status_code == 401
        assert refused.json()["error"]["status"] == "UNAUTHENTICATED"
        assert refused.headers["www-authenticate"].startswith("Bearer")
    bearer = access_token(sandbox)
    assert fcm(sandbox, bearer, message).status_code == 200
    entry = sandbox_state.access_tokens[bearer]
    sandbox_state.access_tokens[bearer] = entry._replace(expires_at=time.monotonic() - 1)
    assert fcm(sandbox, bearer, message).status_code == 401
    narrow = token_answer(
        sandbox, assertion(sandbox, scope="https://www.googleapis.com/auth/userinfo.email")
    )
    insufficient = fcm(sandbox, narrow.json()["access_token"], message)
    assert insufficient.status_code == 403
    assert (
        insufficient.json()["error"]["message"] == "Request had insufficient authentication scopes."
    )
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 1
