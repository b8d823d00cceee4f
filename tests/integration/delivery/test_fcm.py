"""The FCM client against the real sandbox over HTTP: every mapping row, OAuth, retries."""

from __future__ import annotations

import asyncio
import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from push_helpers import DATA, FakeClock, message

from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.credentials import fcm_credentials
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.delivery.providers import open_provider
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.store.models import App, Platform


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("ok-1", ""),
        ("unregistered-1", "FPErrTokenUnregistered"),
        ("mismatch-1", "FPErrTokenUnregistered"),
        ("expired-1", "FPErrBadRecipientToken"),
        ("invalid-1", "FPErrBadRecipientToken"),
        ("fail-1", "FPErrPushFailed"),
        ("flaky-1", ""),
        ("throttled-1", ""),
    ],
)
async def test_each_sandbox_outcome_maps_to_its_report_value(
    settings: Settings, android_app: App, token: str, expected: str
) -> None:
    provider = open_provider(Platform.android, settings=settings)
    try:
        [result] = await provider.send_many([message(7, token)])
    finally:
        await provider.aclose()
    assert result.key == 7
    assert result.error_message == expected
    assert (result.sent_at is not None) == (expected == "")
    assert (result.unregistered_at is not None) == (expected == "FPErrTokenUnregistered")
    assert not provider.auth_failed


async def test_delivered_payload_carries_rendered_title_body_and_data(
    settings: Settings, sandbox: str
) -> None:
    provider = FcmProvider(fcm_credentials(settings))
    before = datetime.now(UTC)
    try:
        results = await provider.send_many(
            [message(i, f"device-{i}", title=f"Hi {i}", body="Déjà vu ✓") for i in range(50)]
        )
    finally:
        await provider.aclose()
    assert all(r.error_message == "" and r.sent_at and r.sent_at >= before for r in results)
    assert [r.key for r in results] == list(range(50))
    [delivery] = httpx.get(f"{sandbox}/sandbox/deliveries", params={"token": "device-3"}).json()
    assert delivery["title"] == "Hi 3"
    assert delivery["body"] == "Déjà vu ✓"
    assert delivery["data"] == DATA
    assert delivery["payload"]["android"] == {"priority": "high"}
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["deliveries"] == 50
    assert set(stats["per_token"].values()) == {1}
    assert set(stats["per_message"].values()) == {1}


async def test_an_unregistered_token_answers_with_the_time_it_was_learned(
    settings: Settings,
) -> None:
    provider = open_provider(Platform.android, settings=settings)
    before = datetime.now(UTC)
    try:
        gone, ok = await provider.send_many([message(0, "unregistered-9"), message(1, "ok-9")])
    finally:
        await provider.aclose()
    assert gone.error_message == "FPErrTokenUnregistered"
    assert gone.unregistered_at is not None
    assert abs((gone.unregistered_at - before).total_seconds()) < 5
    assert ok.error_message == ""
    assert ok.unregistered_at is None


async def test_access_token_is_reused_until_near_expiry_then_refetched(
    settings: Settings, sandbox_state: SandboxState
) -> None:
    clock = FakeClock()
    clock.now -= 3300  # every assertion signed below is then in the past and unexpired
    provider = FcmProvider(fcm_credentials(settings), clock=clock)
    issued_before = sandbox_state.token_requests
    try:
        await provider.send_many([message(i, f"a-{i}") for i in range(20)])
        await provider.send_many([message(i, f"b-{i}") for i in range(20)])
        assert sandbox_state.token_requests - issued_before == 1
        clock.now += 3599 - 301  # still more than the 300 s margin left
        await provider.send_many([message(0, "c-0")])
        assert sandbox_state.token_requests - issued_before == 1
        clock.now += 2  # now inside the margin
        [result] = await provider.send_many([message(0, "d-0")])
        assert result.error_message == ""
        assert sandbox_state.token_requests - issued_before == 2
    finally:
        await provider.aclose()
    claims = sandbox_state.assertions[-1]["claims"]
    assert sandbox_state.assertions[-1]["header"]["alg"] == "RS256"
    assert claims["scope"] == "https://www.googleapis.com/auth/firebase.messaging"
    assert claims["aud"] == settings.fcm_token_uri
    assert claims["exp"] - claims["iat"] == 3600


async def test_flaky_answer_is_retried_after_retry_after_and_delivered_once(
    settings: Settings, sandbox: str
) -> None:
    provider = FcmProvider(fcm_credentials(settings), max_attempts=3)
    started = time.monotonic()
    try:
        [result] = await provider.send_many([message(0, "flaky-once")])
    finally:
        await provider.aclose()
    assert result.error_message == ""
    assert time.monotonic() - started >= 0.95  # the sandbox's Retry-After: 1
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["requests_per_token"]["flaky-once"] == 2
    assert stats["per_token"] == {"flaky-once": 1}


async def test_failing_provider_gives_push_failed_after_max_attempts(
    settings: Settings, sandbox: str
) -> None:
    provider = FcmProvider(fcm_credentials(settings), max_attempts=3, backoff_base=0.01)
    global_random = random.getstate()
    try:
        [result] = await provider.send_many([message(0, "fail-always")])
    finally:
        await provider.aclose()
    # The backoffs' jitter leaves the application's global generator alone.
    assert random.getstate() == global_random
    assert result.error_message == "FPErrPushFailed"
    assert result.sent_at is None
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["requests_per_token"]["fail-always"] == 3
    assert stats["deliveries"] == 0


async def test_payload_over_4_kb_or_unserialisable_is_never_sent(
    settings: Settings, sandbox: str
) -> None:
    provider = FcmProvider(fcm_credentials(settings))
    try:
        results = await provider.send_many(
            [
                message(0, "big", body="x" * 4100),
                message(1, "surrogate", body="bad \ud800"),
                PushMessage(key=2, token="notstr", title="t", body="b", data={"n": 1}),  # type: ignore[dict-item]
                message(3, "fine", body="y" * 3900),
            ]
        )
    finally:
        await provider.aclose()
    assert [r.error_message for r in results] == ["FPErrJSONMarshalling"] * 3 + [""]
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["requests_per_token"] == {"fine": 1}


async def test_refused_credentials_stop_sending(settings: Settings, sandbox: str) -> None:
    denied = settings.model_copy(update={"fcm_project_id": "denied-project"})
    provider = open_provider(Platform.android, settings=denied)
    try:
        results = await provider.send_many([message(i, f"tok-{i}") for i in range(100)])
    finally:
        await provider.aclose()
    assert {r.error_message for r in results} == {"FPErrPushFailed"}
    assert provider.auth_failed
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["requests"] <= 32  # one per worker


async def test_service_account_file_is_used_and_a_refused_one_stops_sending(
    settings: Settings, tmp_path: Path, sandbox_state: SandboxState
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "file-project",
        "private_key_id": "abc123",
        "private_key": pem,
        "client_email": "pusher@file-project.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(info))
    # as one uploads a key in Google's console, the sandbox is told its public half
    registered = httpx.post(
        f"{settings.fcm_base_url}/sandbox/keys",
        json={
            "kind": "google",
            "key_id": "abc123",
            "pem": pem,
            "client_email": info["client_email"],
        },
    )
    assert registered.status_code == 201
    configured = settings.model_copy(update={"fcm_credentials_file": str(path)})
    assert fcm_credentials(configured).token_uri == settings.fcm_token_uri  # explicit wins
    assert pem not in repr(fcm_credentials(configured))
    provider = open_provider(Platform.android, settings=configured)
    try:
        [result] = await provider.send_many([message(0, "ok-file")])
    finally:
        await provider.aclose()
    assert result.error_message == ""
    assert sandbox_state.assertions[-1]["claims"]["iss"] == info["client_email"]
    assert sandbox_state.assertions[-1]["header"]["kid"] == "abc123"

    path.write_text(json.dumps({**info, "client_email": "denied@file-project.iam"}))
    provider = open_provider(Platform.android, settings=configured)
    try:
        [result] = await provider.send_many([message(0, "ok-file-2")])
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert provider.auth_failed


async def test_unreachable_provider_is_retried_then_push_failed(
    settings: Settings, closed_port: int
) -> None:
    unreachable = settings.model_copy(update={"fcm_base_url": f"http://127.0.0.1:{closed_port}"})
    provider = FcmProvider(fcm_credentials(unreachable), max_attempts=2, backoff_base=0.01)
    try:
        [result] = await provider.send_many([message(0, "ok-nowhere")])
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert not provider.auth_failed


async def test_a_prepared_provider_sends_with_no_token_or_connection_left_to_make(
    settings: Settings, sandbox: str
) -> None:
    """What a chunk readies before its send time: the access token and a connection."""
    provider = FcmProvider(fcm_credentials(settings))
    try:
        await provider.prepare()
        assert (provider.tokens.fetches, provider.pool.connections_opened) == (1, 1)
        [result] = await provider.send_many([message(0, "ok-prepared")])
        await provider.prepare()  # ready already: nothing more
    finally:
        await provider.aclose()
    assert result.error_message == ""
    assert (provider.tokens.fetches, provider.pool.connections_opened) == (1, 1)


async def test_preparing_a_provider_that_cannot_be_reached_raises_nothing(
    settings: Settings, sandbox: str, closed_port: int
) -> None:
    """The sends try again and report it (``FPErrPushFailed``, the app flagged if its
    credentials were refused)."""
    nobody = f"http://127.0.0.1:{closed_port}"
    for unreachable in (
        settings.model_copy(update={"fcm_token_uri": f"{nobody}/token"}),
        settings.model_copy(update={"fcm_base_url": nobody}),
    ):
        provider = FcmProvider(fcm_credentials(unreachable))
        try:
            await provider.prepare()
        finally:
            await provider.aclose()
        assert provider.pool.connections_opened == 0  # the token, or the connection, failed
        assert not provider.auth_failed


async def test_an_answer_not_recorded_stops_the_other_sends_and_gives_every_slot_back(
    settings: Settings, sandbox: str
) -> None:
    """The first answer's record fails; the others never return, as with the recorder
    a failed chunk abandons: the call fails at once, and the sends still waiting are
    stopped, their slots given back for the process's next chunk."""
    provider = FcmProvider(fcm_credentials(settings), concurrency=4)
    answers = 0

    async def record_failing_first(result: object) -> None:
        nonlocal answers
        answers += 1
        if answers == 1:
            raise OSError("the report could not be written")
        await asyncio.Event().wait()  # the abandoned recorder never answers

    held, all_held = 0, asyncio.Event()

    async def record_once_all_slots_are_held(result: object) -> None:
        nonlocal held
        held += 1
        if held == 4:
            all_held.set()
        await all_held.wait()

    try:
        with pytest.raises(OSError, match="could not be written"):
            await asyncio.wait_for(
                provider.send_many(
                    [message(i, f"lost-{i}") for i in range(20)], on_result=record_failing_first
                ),
                10,
            )
        results = await asyncio.wait_for(  # for ever while stuck sends hold slots
            provider.send_many(
                [message(i, f"after-{i}") for i in range(4)],
                on_result=record_once_all_slots_are_held,
            ),
            10,
        )
    finally:
        await provider.aclose()
    assert [r.error_message for r in results] == [""] * 4
