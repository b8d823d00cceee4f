"""Fixtures for the delivery tests: a real sandbox on a free port, settings pointing at
it, apps in an isolated database, and a small HTTP/2 server that sends GOAWAY."""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx
import pytest

from campaign_trigger.config import Settings, get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import App, Organisation, Platform
from support import free_port


@pytest.fixture
def closed_port() -> int:
    """A port with nothing listening."""
    return free_port()


@pytest.fixture(scope="session")
def delivery_database() -> str:
    """The session's database: CT_HOME must be a temporary folder; migrated to head."""
    if not os.environ.get("CT_HOME"):
        os.environ["CT_HOME"] = tempfile.mkdtemp(prefix="ct-delivery-")
    get_settings.cache_clear()
    settings = get_settings()
    assert Path(settings.home).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    upgrade(settings.database_url)
    return settings.database_url


@pytest.fixture(scope="session")
def sandbox_ports() -> tuple[int, int]:
    """The session sandbox's cleartext and TLS ports."""
    return free_port(), free_port()


@pytest.fixture(scope="session")
def sandbox_session(sandbox_ports: tuple[int, int]) -> Iterator[tuple[str, SandboxState]]:
    """The sandbox (cleartext and TLS), served in a thread, for the whole session."""
    port, tls_port = sandbox_ports
    with running_sandbox(host="127.0.0.1", port=port, tls_port=tls_port) as state:
        yield f"http://127.0.0.1:{port}", state


@pytest.fixture
def sandbox_tls(sandbox_ports: tuple[int, int], sandbox: str) -> str:
    """The sandbox's TLS base URL (its deliveries cleared for this test)."""
    return f"https://127.0.0.1:{sandbox_ports[1]}"


@pytest.fixture
def sandbox(sandbox_session: tuple[str, SandboxState]) -> str:
    """The sandbox's base URL, its deliveries cleared (over HTTP) for this test."""
    url, _ = sandbox_session
    assert httpx.delete(f"{url}/sandbox/deliveries").status_code == 200
    return url


@pytest.fixture
def sandbox_state(sandbox_session: tuple[str, SandboxState], sandbox: str) -> SandboxState:
    """The sandbox's memory (read-only use in tests)."""
    return sandbox_session[1]


@pytest.fixture
def settings(sandbox: str, delivery_database: str) -> Settings:
    """Settings with every provider URL on the test sandbox and a short retry budget."""
    return get_settings().model_copy(
        update={
            "fcm_base_url": sandbox,
            "fcm_token_uri": f"{sandbox}/token",
            "apns_base_url": sandbox,
            "delivery_max_attempts": 3,
            "delivery_concurrency": 32,
        }
    )


def make_app(platform: Platform) -> App:
    """A fresh organisation and app in the session database."""
    suffix = uuid.uuid4().hex[:10]
    with session_scope() as session:
        org = Organisation(name=f"org-{suffix}")
        session.add(org)
        session.flush()
        assert org.id is not None
        app = App(app_id=f"app-{suffix}", org_id=org.id, platform=platform, sdk_key=f"key-{suffix}")
        session.add(app)
    return app


@pytest.fixture
def android_app(delivery_database: str) -> App:
    return make_app(Platform.android)


@pytest.fixture
def ios_app(delivery_database: str) -> App:
    return make_app(Platform.ios)


@dataclass
class GoawayServer:
    """An h2c server answering 200 to ``streams_per_connection`` streams per connection,
    then sending GOAWAY with ``last_stream_id`` = the last stream it processed; streams
    above it are never answered nor recorded (as RFC 9113 §6.8 allows)."""

    streams_per_connection: int
    port: int = 0
    processed: list[str] = field(default_factory=list)  # the device tokens, in order
    connections: int = 0
    goaways: int = 0
    # instead of GOAWAY, drop the connection (TCP reset) with the later streams in flight
    abort: bool = False
    # GOAWAY first, naming the last stream as processed, and that stream's answer after it
    # (a graceful shutdown: RFC 9113 §6.8 lets streams up to last_stream_id complete)
    graceful: bool = False


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload
    )


def _goaway_then_answer(stream_id: int) -> bytes:
    """GOAWAY naming ``stream_id`` the last processed, then its answer: ``:status 200``
    (HPACK static index 8: no dynamic table entry), ending the stream. Written by hand:
    h2 sends nothing once it has sent a GOAWAY."""
    goaway = _frame(0x7, 0, 0, struct.pack(">II", stream_id, 0))
    return goaway + _frame(0x1, 0x1 | 0x4, stream_id, b"\x88")


class _GoawayProtocol(asyncio.Protocol):
    def __init__(self, server: GoawayServer) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.paths: dict[int, str] = {}
        self.done = 0
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections += 1
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100})
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            if self.gone:  # frames the client sent before it read the GOAWAY: ignored
                return  # (RFC 9113 §6.8), as h2 refuses them once its side is closed
            raise
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.paths[event.stream_id] = dict(event.headers)[b":path"].decode()
            elif isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and not self.gone:
                stream_id = event.stream_id
                self.server.processed.append(self.paths[stream_id].rsplit("/", 1)[-1])
                self.done += 1
                last = self.done >= self.server.streams_per_connection
                if last and self.server.graceful:
                    self.gone = True
                    self.server.goaways += 1
                    self.transport.write(self.h2.data_to_send())
                    self.transport.write(_goaway_then_answer(stream_id))
                    asyncio.get_running_loop().call_later(0.05, self.transport.close)
                    return
                self.h2.send_headers(
                    stream_id, [(":status", "200"), ("apns-id", "x")], end_stream=True
                )
                if last:
                    self.gone = True
                    self.server.goaways += 1
                    loop = asyncio.get_running_loop()
                    if self.server.abort:  # the answers so far leave first
                        loop.call_later(0.05, self.transport.abort)
                    else:
                        self.h2.close_connection(last_stream_id=stream_id)
                        loop.call_later(0.05, self.transport.close)
        if self.transport and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())


@pytest.fixture(params=["goaway", "reset", "graceful"])
async def goaway_server(request: pytest.FixtureRequest) -> AsyncIterator[GoawayServer]:
    """A :class:`GoawayServer` (10 streams per connection) on a free port: one that says
    GOAWAY, one that drops its connections without a word, and one that says GOAWAY
    before its last answer."""
    server = GoawayServer(
        streams_per_connection=10,
        abort=request.param == "reset",
        graceful=request.param == "graceful",
    )
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _GoawayProtocol(server), "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()
    await listener.wait_closed()


@dataclass
class StreamLimitServer:
    """An h2c server that allows ``max_streams`` concurrent streams per connection and
    answers each request 200 after ``delay`` seconds. Until the client acknowledges
    that limit, a stream beyond it is refused (RST_STREAM REFUSED_STREAM, RFC 9113
    §5.1.2: not processed); once acknowledged, h2 raises on any excess stream. It
    records the most streams open at once and each device token it answered."""

    max_streams: int
    delay: float = 0.005
    port: int = 0
    most_open: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)


class _StreamLimitProtocol(asyncio.Protocol):
    def __init__(self, server: StreamLimitServer) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.open: dict[int, str] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        limit = self.server.max_streams
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limit})
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # e.g. too many streams once acked
            self.server.errors.append(repr(exc))
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                if len(self.open) >= self.server.max_streams:
                    self.server.refused += 1
                    self.h2.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                    continue
                self.open[event.stream_id] = dict(event.headers)[b":path"].decode()
                self.server.most_open = max(self.server.most_open, len(self.open))
            elif isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id in self.open:
                loop = asyncio.get_running_loop()
                loop.call_later(self.server.delay, self._answer, event.stream_id)
        self.transport.write(self.h2.data_to_send())

    def _answer(self, stream_id: int) -> None:
        if self.transport.is_closing():
            return
        self.server.processed.append(self.open.pop(stream_id).rsplit("/", 1)[-1])
        self.h2.send_headers(stream_id, [(":status", "200"), ("apns-id", "x")], end_stream=True)
        self.transport.write(self.h2.data_to_send())


@pytest.fixture
async def stream_limit_server() -> AsyncIterator[StreamLimitServer]:
    """A :class:`StreamLimitServer` allowing 5 concurrent streams, on a free port."""
    server = StreamLimitServer(max_streams=5)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _StreamLimitProtocol(server), "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()
    await listener.wait_closed()
