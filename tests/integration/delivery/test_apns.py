"""The APNs client against the real sandbox over HTTP/2 (h2c): mapping, JWT, GOAWAY."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
import jwt
import pycurl
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from push_helpers import DATA, FakeClock, message

from campaign_trigger.config import Settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.credentials import apns_credentials
from campaign_trigger.delivery.curl_h2 import CurlPool, http2_supported
from campaign_trigger.delivery.h2client import H2Pool
from campaign_trigger.delivery.providers import open_provider
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
        ("expiredprovidertoken-1", ""),
    ],
)
async def test_each_sandbox_outcome_maps_to_its_report_value(
    settings: Settings, ios_app: App, token: str, expected: str
) -> None:
    provider = open_provider(Platform.ios, settings=settings)
    try:
        [result] = await provider.send_many([message(3, token)])
    finally:
        await provider.aclose()
    assert (result.key, result.error_message) == (3, expected)
    assert (result.sent_at is not None) == (expected == "")
    assert (result.unregistered_at is not None) == (expected == "FPErrTokenUnregistered")


async def test_requests_go_over_http2_with_the_apns_headers(
    settings: Settings, sandbox: str
) -> None:
    provider = ApnsProvider(apns_credentials(settings))
    try:
        results = await provider.send_many(
            [message(i, f"phone-{i}", title=f"T{i}", body="Grüße") for i in range(300)]
        )
    finally:
        await provider.aclose()
    assert all(r.error_message == "" for r in results)
    assert provider.pool.connections_opened <= 3  # 300 messages, ~100 streams per connection
    deliveries = httpx.get(f"{sandbox}/sandbox/deliveries").json()
    assert len(deliveries) == 300
    first = next(d for d in deliveries if d["token"] == "phone-7")
    assert first["http_version"] == "2"
    assert (first["title"], first["body"], first["data"]) == ("T7", "Grüße", DATA)
    assert first["payload"]["aps"]["alert"] == {"title": "T7", "body": "Grüße"}
    assert first["topic"] == settings.apns_topic
    uuid.UUID(first["message_id"])
    assert len({d["message_id"] for d in deliveries}) == 300
    assert len({d["provider_token_id"] for d in deliveries}) == 1  # one JWT reused
    assert provider.tokens.minted == 1


async def test_jwt_is_reused_for_its_window_then_renewed(settings: Settings) -> None:
    clock = FakeClock()
    clock.now -= 45 * 60  # every JWT minted below is then in the past and under an hour old
    provider = ApnsProvider(apns_credentials(settings), clock=clock, jwt_reuse_seconds=40 * 60)
    try:
        await provider.send_many([message(0, "jwt-a")])
        first = provider.tokens.get()
        clock.now += 39 * 60
        await provider.send_many([message(0, "jwt-b")])
        assert provider.tokens.get() == first
        clock.now += 2 * 60
        [result] = await provider.send_many([message(0, "jwt-c")])
        assert result.error_message == ""
        assert provider.tokens.get() != first
    finally:
        await provider.aclose()
    header = jwt.get_unverified_header(first)
    claims = jwt.decode(first, options={"verify_signature": False})
    assert header["alg"] == "ES256"
    assert header["kid"]
    assert set(claims) == {"iss", "iat"}


async def test_expired_provider_token_gets_a_new_jwt_and_one_retry(
    settings: Settings, sandbox: str
) -> None:
    provider = ApnsProvider(apns_credentials(settings))
    try:
        results = await provider.send_many(
            [message(i, f"expiredprovidertoken-{i}") for i in range(5)]
        )
    finally:
        await provider.aclose()
    assert all(r.error_message == "" for r in results)
    assert provider.tokens.minted == 2  # one renewal shared by every stream that hit it
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert set(stats["requests_per_token"].values()) == {2}
    assert set(stats["per_token"].values()) == {1}


async def test_an_unregistered_token_answers_with_apples_timestamp(
    settings: Settings,
) -> None:
    provider = open_provider(Platform.ios, settings=settings)
    before = datetime.now(UTC)
    try:
        [result] = await provider.send_many([message(0, "unregistered-i1")])
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrTokenUnregistered"
    assert result.unregistered_at is not None
    assert abs((result.unregistered_at - before).total_seconds()) < 5


async def test_flaky_is_retried_with_the_same_apns_id(settings: Settings, sandbox: str) -> None:
    provider = ApnsProvider(apns_credentials(settings))
    started = time.monotonic()
    try:
        [result] = await provider.send_many([message(0, "flaky-ios")])
    finally:
        await provider.aclose()
    assert result.error_message == ""
    assert time.monotonic() - started >= 0.95
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["requests_per_token"]["flaky-ios"] == 2
    assert stats["per_token"]["flaky-ios"] == 1


async def test_fail_gives_push_failed_after_max_attempts(settings: Settings, sandbox: str) -> None:
    provider = ApnsProvider(apns_credentials(settings), max_attempts=3, backoff_base=0.01)
    try:
        [result] = await provider.send_many([message(0, "fail-ios")])
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["requests_per_token"]["fail-ios"] == 3


async def test_payload_over_4_kb_is_never_sent(settings: Settings, sandbox: str) -> None:
    provider = ApnsProvider(apns_credentials(settings))
    try:
        big, reserved, fine = await provider.send_many(
            [
                message(0, "big-ios", body="é" * 2100),
                PushMessage(key=1, token="aps-ios", title="t", body="b", data={"aps": "x"}),
                message(2, "fine-ios", body="z" * 3900),
            ]
        )
    finally:
        await provider.aclose()
    assert big.error_message == reserved.error_message == "FPErrJSONMarshalling"
    assert fine.error_message == ""
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["requests_per_token"] == {"fine-ios": 1}


async def test_refused_provider_token_flags_the_app(
    settings: Settings, ios_app: App, tmp_path: Path
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "AuthKey_DENIED1234.p8"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    configured = settings.model_copy(
        update={"apns_key_file": str(path), "apns_key_id": "DENIED1234", "apns_team_id": "TEAM1"}
    )
    provider = open_provider(Platform.ios, settings=configured)
    try:
        results = await provider.send_many([message(i, f"ok-{i}") for i in range(20)])
    finally:
        await provider.aclose()
    assert {r.error_message for r in results} == {"FPErrPushFailed"}
    assert provider.auth_failed


def test_the_apns_transport_is_libcurl_with_http2(settings: Settings) -> None:
    assert http2_supported(), pycurl.version  # pycurl's wheel bundles nghttp2
    provider = ApnsProvider(apns_credentials(settings))
    assert isinstance(provider.pool, CurlPool)
    assert isinstance(ApnsProvider(apns_credentials(settings), http2="h2").pool, H2Pool)


@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_streams_left_by_goaway_or_a_lost_connection_are_resent_once(
    settings: Settings,
    goaway_server: Any,  # conftest.GoawayServer
    http2: Literal["curl", "h2"],
) -> None:
    credentials = apns_credentials(
        settings.model_copy(update={"apns_base_url": f"http://127.0.0.1:{goaway_server.port}"})
    )
    # every connection dies after 10 streams: a stream lost with one counts as a try
    provider = ApnsProvider(
        credentials,
        concurrency=40,
        max_connections=2,
        http2=http2,
        max_attempts=50,
        backoff_base=0.001,
    )
    tokens = [f"gw-{i}" for i in range(200)]
    try:
        results = await provider.send_many([message(i, t) for i, t in enumerate(tokens)])
    finally:
        await provider.aclose()
    # GOAWAY or a dropped connection: the unanswered streams are re-sent, none lost,
    # and none answered is sent again
    assert [r.error_message for r in results] == [""] * 200
    assert sorted(goaway_server.processed) == sorted(tokens)  # each processed exactly once
    assert goaway_server.goaways >= 19
    assert goaway_server.connections >= 20


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_the_servers_stream_limit_is_never_exceeded(
    settings: Settings,
    stream_limit_server: Any,  # conftest.StreamLimitServer
    http2: Literal["curl", "h2"],
    prepared: bool,
) -> None:
    """Unprepared, libcurl's first request goes alone until the server's limit is known;
    prepared (before a chunk's send time), the probe that opened the connection learnt it
    and the first send goes as a burst at once, within it."""
    base = f"http://127.0.0.1:{stream_limit_server.port}"
    credentials = apns_credentials(settings.model_copy(update={"apns_base_url": base}))
    provider = ApnsProvider(credentials, concurrency=64, max_connections=1, http2=http2)
    tokens = [f"lim-{i}" for i in range(120)]
    try:
        if prepared:
            await provider.prepare()
        probes = list(stream_limit_server.processed)  # libcurl's request to "/"
        results = await provider.send_many([message(i, t) for i, t in enumerate(tokens)])
    finally:
        await provider.aclose()
    assert probes == ([""] if prepared and http2 == "curl" else [])
    assert [r.error_message for r in results] == [""] * 120
    assert sorted(stream_limit_server.processed[len(probes) :]) == sorted(tokens)  # each once
    assert provider.pool.connections_opened == 1
    assert stream_limit_server.most_open == 5  # the limit is used, and never exceeded
    assert stream_limit_server.errors == []
    assert stream_limit_server.refused == 0  # the client waited for the server's limit


@pytest.mark.parametrize("prepared", [False, True])
async def test_unreachable_apns_is_retried_then_push_failed(
    settings: Settings, closed_port: int, prepared: bool
) -> None:
    """Prepared first (:meth:`ApnsProvider.prepare`, before a chunk's send time), too:
    preparing raises nothing, and the sends try again and report it."""
    credentials = apns_credentials(
        settings.model_copy(update={"apns_base_url": f"http://127.0.0.1:{closed_port}"})
    )
    provider = ApnsProvider(credentials, max_attempts=2, backoff_base=0.01)
    try:
        if prepared:
            await provider.prepare()
            assert provider.pool.connections_opened == 0
        [result] = await provider.send_many([message(0, "ok-nowhere")])
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert not provider.auth_failed


@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_a_prepared_provider_sends_on_the_connection_it_opened(
    settings: Settings, sandbox: str, http2: Literal["curl", "h2"]
) -> None:
    """What a chunk readies before its send time: the provider token and a connection
    (libcurl's through a request naming no device, answered ``BadPath``)."""
    provider = ApnsProvider(apns_credentials(settings), http2=http2)
    try:
        await provider.prepare()
        assert (provider.tokens.minted, provider.pool.connections_opened) == (1, 1)
        assert httpx.get(f"{sandbox}/sandbox/stats").json()["requests"] == 0  # no device
        results = await provider.send_many([message(i, f"prep-{i}") for i in range(50)])
        await provider.prepare()  # ready already: nothing more
    finally:
        await provider.aclose()
    assert [r.error_message for r in results] == [""] * 50
    assert (provider.tokens.minted, provider.pool.connections_opened) == (1, 1)
    assert len(httpx.get(f"{sandbox}/sandbox/deliveries").json()) == 50


@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_concurrent_calls_share_the_slots_each_held_until_its_result_is_recorded(
    settings: Settings, sandbox: str, http2: Literal["curl", "h2"]
) -> None:
    provider = ApnsProvider(apns_credentials(settings), concurrency=5, http2=http2)
    sent = recorded = most_unrecorded = 0
    request = provider.pool.request

    async def counted_request(*args: Any) -> Any:  # the h2 client's sends, and retries
        nonlocal sent
        sent += 1
        return await request(*args)

    if isinstance(provider.pool, CurlPool):
        start = provider.pool.start

        def counted_start(*args: Any) -> None:  # libcurl's first tries
            nonlocal sent, most_unrecorded
            sent += 1
            most_unrecorded = max(most_unrecorded, sent - recorded)
            start(*args)

        provider.pool.start = counted_start  # type: ignore[method-assign, assignment]
    provider.pool.request = counted_request  # type: ignore[method-assign, assignment]

    async def record(result: Any) -> None:
        nonlocal recorded, most_unrecorded
        most_unrecorded = max(most_unrecorded, sent - recorded)
        await asyncio.sleep(0.001)  # the slot stays held while the caller records
        recorded += 1

    try:
        batches = await asyncio.gather(
            *(
                provider.send_many([message(i, f"{name}-{i}") for i in range(30)], on_result=record)
                for name in ("share-a", "share-b", "share-c")
            )
        )
        again = await provider.send_many(
            [message(i, f"again-{i}") for i in range(12)], on_result=record
        )
    finally:
        await provider.aclose()
    assert [[r.key for r in results] for results in batches] == [list(range(30))] * 3
    assert {r.error_message for results in [*batches, again] for r in results} == {""}
    assert recorded == 102
    assert most_unrecorded == 5  # every slot used, never more sent than recorded + 5
    assert len(httpx.get(f"{sandbox}/sandbox/deliveries").json()) == 102


@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_a_cancelled_or_failed_call_gives_its_slots_back(
    settings: Settings, sandbox: str, http2: Literal["curl", "h2"]
) -> None:
    provider = ApnsProvider(apns_credentials(settings), concurrency=4, http2=http2)
    recording = asyncio.Event()

    async def stuck(result: Any) -> None:
        recording.set()
        await asyncio.Event().wait()  # never recorded

    async def broken(result: Any) -> None:
        raise RuntimeError("the report could not be written")

    try:
        call = asyncio.create_task(
            provider.send_many([message(i, f"stuck-{i}") for i in range(20)], on_result=stuck)
        )
        await recording.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        with pytest.raises(RuntimeError, match="could not be written"):
            await asyncio.wait_for(  # waits forever for slots the cancelled call kept
                provider.send_many(
                    [message(i, f"broken-{i}") for i in range(20)], on_result=broken
                ),
                10,
            )
        results = await asyncio.wait_for(
            provider.send_many([message(i, f"after-{i}") for i in range(8)]), 10
        )
    finally:
        await provider.aclose()
    assert [r.error_message for r in results] == [""] * 8
