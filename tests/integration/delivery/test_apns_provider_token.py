"""APNs over real HTTP/2 connections to strict local servers: a renewed provider token
never carries an ``iat`` in the future (Apple answers 403 InvalidProviderToken), and a
stream that times out leaves no "Future exception was never retrieved" behind."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from push_helpers import FakeClock, message

from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.credentials import ApnsCredentials
from campaign_trigger.delivery.curl_h2 import CurlPool
from campaign_trigger.delivery.h2client import H2Pool


@dataclass
class StrictApns:
    """Checks each provider JWT as Apple does: ES256 under the team's key, ``iat`` not in
    the future (by ``clock``); answers ExpiredProviderToken to the first token it sees."""

    public_key: ec.EllipticCurvePublicKey
    clock: Callable[[], float]
    answer: bool = True
    port: int = 0
    reasons: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)

    def judge(self, authorization: str) -> tuple[int, str]:
        token = authorization.removeprefix("bearer ")
        self.tokens.append(token)
        try:
            claims = jwt.decode(token, self.public_key, algorithms=["ES256"])
        except jwt.PyJWTError:
            return 403, "InvalidProviderToken"
        if int(claims["iat"]) > self.clock():
            return 403, "InvalidProviderToken"
        if token == self.tokens[0]:
            return 403, "ExpiredProviderToken"
        return 200, ""


class _Protocol(asyncio.Protocol):
    def __init__(self, server: StrictApns) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.headers: dict[int, dict[bytes, bytes]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.headers[event.stream_id] = {bytes(k): bytes(v) for k, v in event.headers}
            elif isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and self.server.answer:
                sent = self.headers[event.stream_id].get(b"authorization", b"").decode()
                status, reason = self.server.judge(sent)
                body = f'{{"reason": "{reason}"}}'.encode() if reason else b""
                self.h2.send_headers(
                    event.stream_id, [(":status", str(status))], end_stream=not body
                )
                if body:
                    self.h2.send_data(event.stream_id, body, end_stream=True)
        self.transport.write(self.h2.data_to_send())


@pytest.fixture
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
async def strict_apns(key: ec.EllipticCurvePrivateKey) -> AsyncIterator[StrictApns]:
    server = StrictApns(public_key=key.public_key(), clock=FakeClock())
    listener = await asyncio.get_running_loop().create_server(
        lambda: _Protocol(server), "127.0.0.1", 0
    )
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()
    await listener.wait_closed()


def _credentials(key: ec.EllipticCurvePrivateKey, port: int) -> ApnsCredentials:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return ApnsCredentials(
        private_key=pem,
        key_id="KEY1234567",
        team_id="TEAM123456",
        topic="com.example.app",
        base_url=f"http://127.0.0.1:{port}",
    )


async def test_a_token_renewed_within_the_second_is_accepted(
    strict_apns: StrictApns, key: ec.EllipticCurvePrivateKey
) -> None:
    clock = strict_apns.clock  # the provider and the server read the same (frozen) time
    provider = ApnsProvider(_credentials(key, strict_apns.port), clock=clock, backoff_base=0.01)
    try:
        [result] = await provider.send_many([message(1, "a" * 64)])
    finally:
        await provider.aclose()
    first, renewed = strict_apns.tokens[0], strict_apns.tokens[-1]
    iats = [jwt.decode(t, options={"verify_signature": False})["iat"] for t in (first, renewed)]
    assert renewed != first
    assert iats[1] <= clock(), iats  # never in the future
    assert result.error_message == "", (result, iats)
    assert provider.tokens.minted == 2


@pytest.mark.parametrize("pool_class", [CurlPool, H2Pool])
async def test_a_timed_out_stream_leaves_no_unretrieved_exception(
    strict_apns: StrictApns, pool_class: type[CurlPool] | type[H2Pool]
) -> None:
    strict_apns.answer = False  # accepts streams, never answers
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        pool = pool_class(f"http://127.0.0.1:{strict_apns.port}", timeout_seconds=0.2)
        for _ in range(3):
            request: Awaitable[object] = (
                pool.request(b"/3/device/x", [b"apns-topic: t"], b"{}")
                if isinstance(pool, CurlPool)
                else pool.request(b"/3/device/x", [(b"apns-topic", b"t")], b"{}")
            )
            with pytest.raises(TimeoutError):
                await request
        await pool.aclose()
        await asyncio.sleep(0.05)
        del pool
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("message") for c in reported] == []
