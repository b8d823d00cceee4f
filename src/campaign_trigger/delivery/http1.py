"""A lean asyncio HTTP/1.1 client for FCM: keep-alive connections, one request each at a time.

Why not aiohttp (which we measured at ~14,000 small POSTs/s): at 10,000+ messages/s
its per-request machinery (request/response objects, header multidicts, timers) costs
~90 µs of CPU per message, most of a core. This client writes one preformatted request
and parses the answer with ``httptools`` (llhttp, in C), for a fraction of that;
``bench/delivery.py`` has the figures. Responses may use ``Content-Length`` or chunked
encoding; ``Connection: close`` is honoured. ``https://`` URLs use TLS (trusting the
system CAs, plus ``ca_file`` when given).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.sandbox_tls import client_context
from campaign_trigger.delivery.sending import TransportError


class Http1Response(NamedTuple):
    """A complete response; header names are lower-case."""

    status: int
    headers: dict[bytes, bytes]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request in flight."""

    def __init__(self, on_lost: Callable[[_Connection], None]) -> None:
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._parser = httptools.HttpResponseParser(self)
        self._future: asyncio.Future[Http1Response] | None = None
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.reusable = True

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(TransportError("unparseable response"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.transport = None
        self._fail(TransportError("connection lost"))
        self._on_lost(self)

    # httptools callbacks ------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        future, self._future = self._future, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        keep_alive = self._parser.should_keep_alive()
        if future is not None and not future.done():
            status = self._parser.get_status_code()
            future.set_result(Http1Response(status, self._headers, b"".join(self._body)))
        self._headers, self._body = {}, []
        if not keep_alive:
            self.close()

    # requests -----------------------------------------------------------------
    def send(self, request: bytes, timeout: float) -> asyncio.Future[Http1Response]:
        """Write a complete request; the future resolves with its response."""
        if self.transport is None or not self.reusable:
            raise TransportError("connection closed")
        freeze.check()  # a worker frozen long enough to lose its runs stops here
        loop = asyncio.get_running_loop()
        self._future = future = loop.create_future()
        self._timer = loop.call_later(timeout, self._time_out)
        self.transport.write(request)
        return future

    def _time_out(self) -> None:
        self._timer = None
        self._fail(TimeoutError("no response in time"))
        self.close()

    def _fail(self, error: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        future, self._future = self._future, None
        if future is not None and not future.done():
            future.set_exception(error)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive connections to one origin, reused last-in first-out."""

    def __init__(
        self, base_url: str, *, timeout_seconds: float = 10.0, ca_file: str | None = None
    ) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "localhost"
        tls = parts.scheme == "https"
        self.port = parts.port or (443 if tls else 80)
        default_port = 443 if tls else 80
        self.authority = self.host if self.port == default_port else f"{self.host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        # ca_file: an extra CA to trust (the sandbox's, in sandbox mode)
        self._ssl: ssl.SSLContext | None = client_context(ca_file) if tls else None
        self._timeout = timeout_seconds
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self.connections_opened = 0

    def _lost(self, connection: _Connection) -> None:
        self._all.discard(connection)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self._lost),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                ),
                self._timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"connect failed: {type(exc).__name__}: {exc}") from None
        self._all.add(connection)
        self.connections_opened += 1
        return connection

    async def warm(self) -> None:
        """Open a connection now if none is idle: the next request need not wait for one."""
        if not any(connection.reusable for connection in self._idle):
            self._idle.append(await self._connect())

    async def request(self, request: bytes) -> Http1Response:
        """Send one complete request; raises TransportError or TimeoutError."""
        connection: _Connection | None = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.reusable:
                connection = candidate
                break
        if connection is None:
            connection = await self._connect()
        response = await connection.send(request, self._timeout)
        if connection.reusable:
            self._idle.append(connection)
        return response

    async def aclose(self) -> None:
        """Close every connection."""
        for connection in list(self._all):
            connection.close()
        self._idle.clear()
        self._all.clear()


def request_head(*, path: str, authority: str, headers: str) -> bytes:
    """The start of a ``POST`` request up to ``Content-Length:`` (see :func:`finish_request`);
    ``headers`` are ``"Name: value\\r\\n"`` lines."""
    return f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n{headers}Content-Length: ".encode(
        "latin-1"
    )


def finish_request(head: bytes, body: bytes) -> bytes:
    """A complete request: ``head`` from :func:`request_head`, then the body."""
    return b"%s%d\r\n\r\n%s" % (head, len(body), body)
