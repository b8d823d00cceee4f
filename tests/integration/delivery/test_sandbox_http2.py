"""The sandbox's HTTP/2 manners, seen by an independent client (the h2 library) on a socket:
no request cap, a graceful GOAWAY that answers every stream it covers, no empty trailing
DATA frame, Apple's JSON for bad paths and methods, and connections that survive them."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
import httpx
import pytest
from sandbox_helpers import APNS_BODY, apns_headers

from campaign_trigger.delivery.sandbox import running_sandbox
from support import free_port


@dataclass
class Answer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    data_frames: list[bytes] = field(default_factory=list)
    ended: bool = False
    reset: int | None = None


class RawH2:
    """An HTTP/2 client connection that records every event per stream."""

    def __init__(self, port: int, *, validate: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=validate)
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.answers: dict[int, Answer] = {}
        self.goaways: list[h2.events.ConnectionTerminated] = []
        self.closed = False

    def request(self, path: str, *, method: str = "POST", body: bytes = APNS_BODY) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", method),
            (":scheme", "http"),
            (":authority", "sandbox"),
            (":path", path),
            *apns_headers().items(),
        ]
        self.conn.send_headers(stream_id, headers, end_stream=not body)
        if body:
            self.conn.send_data(stream_id, body, end_stream=True)
        self.answers[stream_id] = Answer()
        self.sock.sendall(self.conn.data_to_send())
        return stream_id

    def pump(self, until: float = 10.0, *, done: int | None = None) -> None:
        """Read until ``done`` streams have ended (or were reset), the peer closed, or time."""
        deadline = time.monotonic() + until
        while time.monotonic() < deadline and not self.closed:
            finished = sum(1 for a in self.answers.values() if a.ended or a.reset is not None)
            if done is not None and finished >= done:
                return
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                self.closed = True
                return
            for event in self.conn.receive_data(data):
                self._record(event)
            outgoing = self.conn.data_to_send()
            if outgoing:
                self.sock.sendall(outgoing)

    def _record(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            answer = self.answers[event.stream_id]
            answer.headers = dict(event.headers or [])
            answer.status = int(answer.headers[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            self.answers[event.stream_id].data_frames.append(event.data or b"")
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.answers[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.answers[event.stream_id].reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaways.append(event)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(sandbox: str) -> Iterator[RawH2]:
    connection = RawH2(int(sandbox.rsplit(":", 1)[1]))
    yield connection
    connection.close()


def test_five_thousand_sends_over_one_connection_strand_no_stream(
    client: RawH2, sandbox: str
) -> None:
    sent = 0
    while sent < 5000:
        for _ in range(min(500, 5000 - sent)):  # 500 in flight, under the 1,000 advertised
            client.request(f"/3/device/ok-many-{sent}")
            sent += 1
        client.pump(done=sent)
    assert client.goaways == []
    assert len(client.answers) == 5000
    assert all(a.ended and a.status == 200 for a in client.answers.values())
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 5000


def test_an_answer_without_a_body_is_one_headers_frame_with_no_empty_data_frame(
    client: RawH2,
) -> None:
    ok = client.request("/3/device/ok-frames")
    bad = client.request("/3/device/invalid-frames")
    client.pump(done=2)
    assert client.answers[ok].status == 200
    assert client.answers[ok].data_frames == []
    assert client.answers[bad].data_frames == [b'{"reason":"BadDeviceToken"}']


def test_bad_paths_and_methods_get_apples_json_and_the_connection_lives_on(
    client: RawH2,
) -> None:
    streams = {
        "BadPath": client.request("/nowhere", body=b"x" * 10_000),
        "BadPath ": client.request("/3/devices/x"),
        "MethodNotAllowed": client.request("/3/device/ok-m", method="GET", body=b""),
        "MissingDeviceToken": client.request("/3/device/"),
    }
    client.pump(done=len(streams))
    got = {
        reason: (client.answers[stream].status, b"".join(client.answers[stream].data_frames))
        for reason, stream in streams.items()
    }
    assert got == {
        "BadPath": (404, b'{"reason":"BadPath"}'),
        "BadPath ": (404, b'{"reason":"BadPath"}'),
        "MethodNotAllowed": (405, b'{"reason":"MethodNotAllowed"}'),
        "MissingDeviceToken": (400, b'{"reason":"MissingDeviceToken"}'),
    }
    after = client.request("/3/device/ok-after")
    client.pump(done=len(streams) + 1)
    assert client.answers[after].status == 200
    assert client.goaways == []


def test_repeated_headers_are_refused_as_duplicate_headers(client: RawH2) -> None:
    stream_id = client.conn.get_next_available_stream_id()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "sandbox"),
        (":path", "/3/device/ok-dup"),
        *apns_headers().items(),
        ("apns-topic", "com.example.other"),
    ]
    client.conn.send_headers(stream_id, headers)
    client.conn.send_data(stream_id, APNS_BODY, end_stream=True)
    client.answers[stream_id] = Answer()
    client.sock.sendall(client.conn.data_to_send())
    client.pump(done=1)
    assert client.answers[stream_id].status == 400
    assert client.answers[stream_id].data_frames == [b'{"reason":"DuplicateHeaders"}']


def test_a_malformed_request_resets_its_stream_only(sandbox: str) -> None:
    client = RawH2(int(sandbox.rsplit(":", 1)[1]), validate=False)  # it sends no :path
    stream_id = client.conn.get_next_available_stream_id()
    client.conn.send_headers(stream_id, [(":method", "POST"), (":scheme", "http")], end_stream=True)
    client.answers[stream_id] = Answer()
    client.sock.sendall(client.conn.data_to_send())
    after = client.request("/3/device/ok-after-malformed")
    client.pump(done=2)
    client.close()
    assert client.answers[stream_id].reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert client.answers[after].status == 200


def read_frames(client: RawH2, *, until: float) -> list[tuple[int, int, int, bytes]]:
    """Every frame the server sends until it closes, parsed by hand: the h2 library refuses
    frames after a GOAWAY (its state machine closes), though RFC 9113 §6.8 has the server
    answer every stream up to ``last_stream_id``; aioapns and httpx inherit that bug."""
    buffer, frames = b"", []
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        try:
            chunk = client.sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        buffer += chunk
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            length = int.from_bytes(buffer[:3], "big")
            kind, flags = buffer[3], buffer[4]
            stream_id = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            frames.append((kind, flags, stream_id, buffer[9 : 9 + length]))
            buffer = buffer[9 + length :]
    return frames


def test_graceful_shutdown_answers_every_stream_up_to_last_stream_id() -> None:
    port = free_port()
    with running_sandbox(port=port, latency_ms=400) as state:
        client = RawH2(port)
        streams = [client.request(f"/3/device/ok-goaway-{n}") for n in range(300)]
        deadline = time.monotonic() + 5
        while len(state.deliveries) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)  # every request is in; each answer waits 400 ms
        # leaving the block shuts the sandbox down gracefully, 300 answers pending
    frames = read_frames(client, until=5)
    client.close()
    goaways = [
        (int.from_bytes(f[3][:4], "big"), int.from_bytes(f[3][4:8], "big"))
        for f in frames
        if f[0] == 0x7
    ]
    assert goaways[0] == (2**31 - 1, 0)  # first: stop opening streams
    last_stream_id, code = goaways[-1]
    assert (last_stream_id, code) == (max(streams), 0)  # then: up to the last one received
    decoder = hpack.Decoder()
    answered = {
        sid: dict(decoder.decode(payload, raw=True))[b":status"]
        for kind, flags, sid, payload in frames
        if kind == 0x1 and flags & 0x1  # HEADERS with END_STREAM: a complete empty answer
    }
    assert answered == dict.fromkeys(streams, b"200")
