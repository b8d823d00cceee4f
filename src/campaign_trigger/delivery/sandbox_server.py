"""The sandbox's listeners: cleartext and TLS, each speaking HTTP/1.1 and HTTP/2.

A connection's protocol is chosen once: ALPN ``h2`` on TLS, else the first bytes (the
HTTP/2 connection preface means h2 with prior knowledge, on cleartext or on TLS
without ALPN as aioapns connects; anything else is HTTP/1.1). :meth:`SandboxServer.close`
stops listening and closes connections gracefully (HTTP/2: two-step GOAWAY, every
stream received answered; HTTP/1.1: after the answers owed), aborting what is left
after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from campaign_trigger.delivery.sandbox_http1 import Http1Connection
from campaign_trigger.delivery.sandbox_http2 import PREFACE, Http2Connection
from campaign_trigger.delivery.sandbox_routes import Router
from campaign_trigger.delivery.sandbox_state import SandboxState

log = logging.getLogger(__name__)


def _noop() -> None:
    return None


class _Connection(asyncio.Protocol):
    """One accepted connection; hands its bytes to the protocol it speaks."""

    def __init__(self, server: SandboxServer, *, tls: bool) -> None:
        self._server = server
        self._tls = tls
        self._scheme = "https" if tls else "http"
        self._transport: Any = None  # uvloop transports are not asyncio.Transport subclasses
        self._sniffed = b""
        self.impl: Http1Connection | Http2Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._server.track(self)
        if self._tls:
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
                self._use_http2(b"")

    def _use_http2(self, initial: bytes) -> None:
        impl = Http2Connection(
            self._transport,
            handle=self._server.router,
            scheme=self._scheme,
            latency=self._server.state.latency_seconds,
            on_closed=_noop,
        )
        self.impl = impl
        impl.start(initial)

    def data_received(self, data: bytes) -> None:
        if self.impl is not None:
            self.impl.feed(data)
            return
        data = self._sniffed + data
        if len(data) < len(PREFACE) and PREFACE.startswith(data):
            self._sniffed = data  # could still be the HTTP/2 preface
            return
        self._sniffed = b""
        if data.startswith(PREFACE):
            self._use_http2(data)
        else:
            self.impl = Http1Connection(
                self._transport,
                handle=self._server.router,
                scheme=self._scheme,
                latency=self._server.state.latency_seconds,
                on_closed=_noop,
            )
            self.impl.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(self.impl, Http2Connection):
            self.impl.lost()
        self._server.forget(self)

    def shutdown(self) -> None:
        if self.impl is None:
            self._transport.close()
        else:
            self.impl.shutdown()

    def abort(self) -> None:
        self._transport.abort()


class SandboxServer:
    """The sandbox on a cleartext port and, given a TLS context, a TLS port."""

    def __init__(
        self,
        state: SandboxState,
        *,
        host: str,
        port: int,
        tls_port: int | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.state = state
        self.router = Router(state)
        self.connections: set[_Connection] = set()
        self._host, self._port = host, port
        self._tls_port, self._tls_context = tls_port, tls_context
        self._servers: list[asyncio.Server] = []
        self._no_connections = asyncio.Event()
        self._no_connections.set()

    def track(self, connection: _Connection) -> None:
        self.connections.add(connection)
        self._no_connections.clear()

    def forget(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._no_connections.set()

    async def start(self) -> None:
        """Listen (raises OSError if a port is taken)."""
        loop = asyncio.get_running_loop()
        self._servers.append(
            await loop.create_server(
                lambda: _Connection(self, tls=False), self._host, self._port, backlog=1024
            )
        )
        if self._tls_port is not None and self._tls_context is not None:
            self._servers.append(
                await loop.create_server(
                    lambda: _Connection(self, tls=True),
                    self._host,
                    self._tls_port,
                    ssl=self._tls_context,
                    backlog=1024,
                )
            )

    async def close(self, *, grace_seconds: float = 10.0) -> None:
        """Stop listening, then close every connection gracefully (abort after the grace)."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.shutdown()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_connections.wait(), grace_seconds)
        for connection in list(self.connections):
            connection.abort()
        for server in self._servers:
            await server.wait_closed()
        if self.connections:
            log.info("aborted %d connections at shutdown", len(self.connections))
