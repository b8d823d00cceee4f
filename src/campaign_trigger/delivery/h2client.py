"""A small asyncio HTTP/2 client for APNs: many streams per connection, GOAWAY aware.

Why not httpx: its HTTP/2 path is slow for thousands of tiny requests and did not
recover cleanly from GOAWAY on our machines. This client multiplexes up to the
server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` streams per connection, batches writes
once per event-loop turn, and follows RFC 9113 §6.8 on GOAWAY: streams above
``last_stream_id`` were not processed and fail with
:class:`~campaign_trigger.delivery.sending.NotProcessed` (the caller re-sends them on a
new connection); streams at or below it are allowed to finish.

``http://`` URLs use cleartext HTTP/2 with prior knowledge (the sandbox), ``https://``
URLs TLS with ALPN ``h2`` (APNs, or the sandbox's TLS port with its CA as ``ca_file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.hpack_plain import PlainEncoder
from campaign_trigger.delivery.sandbox_tls import client_context
from campaign_trigger.delivery.sending import NotProcessed, TransportError

if TYPE_CHECKING:
    from h2.events import Event
    from hyperframe.frame import Frame, GoAwayFrame

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class H2Response:
    """A complete response."""

    status: int
    headers: dict[bytes, bytes]
    body: bytes


@dataclass(slots=True)
class _Stream:
    future: asyncio.Future[H2Response]
    pending_body: bytes | None = None
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


def _retrieve(future: asyncio.Future[H2Response]) -> None:
    if not future.cancelled():
        future.exception()


class _H2(h2.connection.H2Connection):
    """h2's client connection, reading on after a GOAWAY.

    The streams up to the GOAWAY's last_stream_id may have been processed, and their
    answers may follow it (RFC 9113 §6.8). h2 closes its side on a GOAWAY and refuses
    every later frame (python-hyper/h2#1181): the connection was dropped, those streams
    failed as lost and were sent again, a message going twice. Open, it reads them; no
    new stream is made on it (``_Connection.usable``)."""

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[Event]]:
        frames, events = super()._receive_goaway_frame(frame)
        self.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        return frames, events


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection (client side)."""

    def __init__(self, on_free: asyncio.Event, *, stream_cap: int) -> None:
        # Our request headers are built correctly by us (lower-case names, no
        # connection-specific fields): h2's per-header validation and normalisation
        # cost more than the rest of a request. Headers are HPACK-encoded by
        # PlainEncoder (see hpack_plain.py): a few hundred bytes more per request,
        # far less CPU.
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            # we read three response headers; h2's per-header checks cost more than that
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
        self.h2 = _H2(config=config)
        self.h2.encoder = PlainEncoder()  # type: ignore[assignment]
        self._stream_cap = stream_cap
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.in_flight = 0
        self.usable = False  # accepts new streams
        self.settings_received = asyncio.get_running_loop().create_future()
        self._on_free = on_free
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    # capacity ---------------------------------------------------------------
    @property
    def max_streams(self) -> int:
        return min(int(self.h2.remote_settings.max_concurrent_streams), self._stream_cap)

    def has_room(self) -> bool:
        return self.usable and self.in_flight < self.max_streams

    # asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        self.usable = True
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._abort("protocol error")
            return
        for event in events:
            self._handle(event)
        self._schedule_flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self.transport = None
        if not self.settings_received.done():
            self.settings_received.set_result(None)
        for stream in self.streams.values():
            if not stream.future.done():
                stream.future.set_exception(TransportError("connection lost"))
        self.streams.clear()
        self.in_flight = 0
        self._on_free.set()

    # events -------------------------------------------------------------------
    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                for name, value in event.headers or ():
                    if name == b":status":
                        stream.status = int(value)
                    else:
                        stream.headers[bytes(name)] = bytes(value)
        elif isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            stream = self.streams.get(event.stream_id)
            if stream is not None and event.data:
                stream.body += event.data
        elif isinstance(event, h2.events.StreamEnded):
            self._finish(event.stream_id, None)
        elif isinstance(event, h2.events.StreamReset):
            refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            error: Exception = (
                NotProcessed("stream refused")
                if refused
                else TransportError(f"stream reset ({event.error_code!r})")
            )
            self._finish(event.stream_id, error)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event.last_stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            if not self.settings_received.done():
                self.settings_received.set_result(None)
            self._send_pending()
            self._on_free.set()
        elif isinstance(event, h2.events.WindowUpdated):
            self._send_pending()

    def _finish(self, stream_id: int, error: Exception | None) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self.in_flight -= 1
        if not stream.future.done():
            if error is not None:
                stream.future.set_exception(error)
            else:
                response = H2Response(stream.status, stream.headers, bytes(stream.body))
                stream.future.set_result(response)
        if not self.usable and not self.streams and self.transport is not None:
            self.transport.close()  # the last stream a GOAWAY let finish
        self._on_free.set()

    def _goaway(self, last_stream_id: int | None) -> None:
        self.usable = False
        last = last_stream_id if last_stream_id is not None else 0
        for stream_id in [sid for sid in self.streams if sid > last]:
            self._finish(stream_id, NotProcessed("GOAWAY: stream not processed"))
        if not self.streams and self.transport is not None:
            self.transport.close()  # else once the streams left are answered (_finish)

    def _abort(self, why: str) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.abort()

    # sending ------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            if self.streams:  # requests among it: not after a freeze too long
                freeze.check()
            self.transport.write(data)
        if not self.usable and not self.streams and self.transport is not None:
            self.transport.close()

    def _send_pending(self) -> None:
        for stream_id, stream in self.streams.items():
            if stream.pending_body is not None:
                self._send_body(stream_id, stream)

    def _send_body(self, stream_id: int, stream: _Stream) -> None:
        body = stream.pending_body or b""
        try:
            window = self.h2.local_flow_control_window(stream_id)
        except h2.exceptions.ProtocolError:
            return
        size = min(window, self.h2.max_outbound_frame_size, len(body))
        if size < len(body) and size <= 0:
            return
        chunk, rest = body[:size], body[size:]
        self.h2.send_data(stream_id, chunk, end_stream=not rest)
        stream.pending_body = rest or None
        self._schedule_flush()

    def start(self, headers: Headers, body: bytes) -> asyncio.Future[H2Response]:
        """Open a stream for one request; the future resolves with its response."""
        if not self.usable or self.transport is None:
            raise NotProcessed("connection not usable")
        try:
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, headers, end_stream=not body)
        except h2.exceptions.ProtocolError as exc:  # e.g. the server lowered its stream limit
            raise NotProcessed(f"stream not opened: {type(exc).__name__}") from None
        future: asyncio.Future[H2Response] = self._loop.create_future()
        # A caller that timed out (or was cancelled) no longer awaits the future: mark
        # its outcome as seen, so asyncio never logs "Future exception was never retrieved".
        future.add_done_callback(_retrieve)
        stream = _Stream(future, pending_body=body or None)
        self.streams[stream_id] = stream
        self.in_flight += 1
        if body:
            self._send_body(stream_id, stream)
        self._schedule_flush()
        return stream.future

    def cancel(self, future: asyncio.Future[H2Response]) -> None:
        for stream_id, stream in list(self.streams.items()):
            if stream.future is future:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                self._finish(stream_id, TransportError("cancelled"))
                self._schedule_flush()

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection()
            self._flush()
            self.transport.close()


class H2Pool:
    """Connections to one origin; a request goes to the first one with a free stream."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 4,
        streams_per_connection: int = 100,
        timeout_seconds: float = 10.0,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        self.scheme = parts.scheme.encode()
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = 443 if parts.scheme == "https" else 80
        authority = self.host if self.port == default_port else f"{self.host}:{self.port}"
        self.authority = authority.encode()
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":  # ca_file: an extra CA to trust (the sandbox's)
            self._ssl = client_context(ca_file, alpn=["h2"])
        self._max_connections = max_connections
        # h2 counts open streams by walking them all on every new stream: many
        # connections with ~100 streams each are cheaper than one with 1,000.
        self._streams_per_connection = streams_per_connection
        self._timeout = timeout_seconds
        self._connections: list[_Connection] = []
        self._free = asyncio.Event()
        self._connecting: asyncio.Task[_Connection] | None = None
        self.connections_opened = 0

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self._free, stream_cap=self._streams_per_connection),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                ),
                self._timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"connect failed: {type(exc).__name__}: {exc}") from None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(connection.settings_received), self._timeout)
        self.connections_opened += 1
        return connection

    async def _connection(self) -> _Connection:
        while True:
            self._connections = [c for c in self._connections if c.usable or c.streams]
            for connection in self._connections:
                if connection.has_room():
                    return connection
            usable = sum(1 for c in self._connections if c.usable)
            if usable < self._max_connections:
                if self._connecting is None:
                    self._connecting = asyncio.ensure_future(self._connect())
                task = self._connecting
                try:
                    connection = await asyncio.shield(task)
                finally:
                    if self._connecting is task and task.done():
                        self._connecting = None
                if connection not in self._connections:
                    self._connections.append(connection)
                if connection.has_room():
                    return connection
                continue
            self._free.clear()
            await self._free.wait()

    async def warm(self) -> None:
        """Open a connection now (its settings received) unless one has room: the next
        request need not wait for it. Raises TransportError."""
        await self._connection()

    async def request(self, path: bytes, headers: Headers, body: bytes) -> H2Response:
        """POST ``body`` to ``path``; raises TransportError, NotProcessed or TimeoutError."""
        connection = await self._connection()
        request_headers: Headers = [
            (b":method", b"POST"),
            (b":scheme", self.scheme),
            (b":authority", self.authority),
            (b":path", path),
            *headers,
        ]
        future = connection.start(request_headers, body)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._timeout)
        except TimeoutError:
            connection.cancel(future)
            raise

    async def aclose(self) -> None:
        """Close every connection (GOAWAY, then the socket)."""
        for connection in self._connections:
            connection.close()
        self._connections.clear()
