"""The sandbox's HTTP/1.1 server side: keep-alive, pipelining, parsed by httptools (llhttp).

Answers go out in request order (a delayed answer holds the ones behind it); a parse
error or a body over 1 MB is answered 400 / 413 and closes the connection; ``Expect:
100-continue`` is honoured; an ``Upgrade: h2c`` offer is ignored (we answer in
HTTP/1.1, as RFC 9113 §3.1 allows: h2c is reached with prior knowledge). A route that
exists only over HTTP/2 (APNs) is refused as an HTTP/2-only server refuses HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Final

import httptools

from campaign_trigger.delivery.sandbox_exchange import HTTP2_REQUIRED, Reply, Request, split_target
from campaign_trigger.delivery.sandbox_http2_frames import http2_only_refusal
from campaign_trigger.logs import without_tokens

log = logging.getLogger(__name__)

_MAX_BODY: Final = 1 << 20
_UPGRADE: Final = re.compile(rb"\r\nupgrade:", re.IGNORECASE)
_NONE_REPEATED: Final[frozenset[bytes]] = frozenset()
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}

Handler = Callable[[Request], Reply]


_heads: dict[tuple[int, tuple[tuple[bytes, bytes], ...], bool], bytes] = {}


def _head(status: int, headers: tuple[tuple[bytes, bytes], ...], length: int, close: bool) -> bytes:
    key = (status, headers, close)
    start = _heads.get(key)
    if start is None:
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        lines.extend(b"%s: %s\r\n" % header for header in headers)
        if close:
            lines.append(b"connection: close\r\n")
        start = b"".join(lines)
        if len(_heads) < 256:  # answers with constant headers (most of them)
            _heads[key] = start
    return b"%scontent-length: %d\r\n\r\n" % (start, length)


class Http1Connection:
    """One server-side HTTP/1.1 connection on an asyncio transport."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        handle: Handler,
        scheme: str,
        latency: Callable[[], float],
        on_closed: Callable[[], None],
    ) -> None:
        self.transport = transport
        self._handle = handle
        self._scheme = scheme
        self._latency = latency
        self._on_closed = on_closed
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._repeated: set[bytes] | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._queue: deque[list[bytes | None]] = deque()  # answers in request order
        self._closing = False
        self.busy = False  # a request is being read or answered

    # input ------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Process bytes from the peer."""
        if self._closing:
            return
        if b"pgrade" in data:
            # llhttp would stop at the headers of an upgrade offer and leave its body
            # unread: we decline h2c upgrades, so the header is renamed before parsing
            data = _UPGRADE.sub(b"\r\nx-declined-upgrade:", data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # the request before the offer was answered; go on with what follows it
            rest = data[upgrade.args[0] :] if upgrade.args else b""
            self._parser = httptools.HttpRequestParser(self)
            if rest:
                self.feed(rest)
        except httptools.HttpParserError as exc:
            if not self._closing:
                log.info("HTTP/1.1 parse error: %s", exc)
                self._reply_now(Reply(400, (), b""), close=True)

    def shutdown(self) -> None:
        """Close once the answers owed are written."""
        self._closing = True
        if not self.busy and not self._queue:
            self.transport.close()

    # httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.busy = True
        self._url, self._headers, self._repeated, self._body, self._size = b"", {}, None, [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in self._headers:
            self._repeated = (self._repeated or set()) | {name}
        self._headers[name] = value

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > _MAX_BODY:
            self._too_large()
        elif self._headers.get(b"expect", b"").lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > _MAX_BODY:
            self._too_large()
        elif not self._closing:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._closing:
            return
        path, query = split_target(self._url)
        request = Request(
            self._parser.get_method(),
            path,
            query,
            self._headers,
            frozenset(self._repeated) if self._repeated else _NONE_REPEATED,
            b"".join(self._body),
            self._parser.get_http_version(),
            self._scheme,
            self._headers.get(b"host", b"").decode("latin-1"),
        )
        keep_alive = self._parser.should_keep_alive()
        reply = self._handle(request)
        if reply.status == HTTP2_REQUIRED:
            log.info("refused HTTP/1.1 %s: HTTP/2 required", without_tokens(path.decode("latin-1")))
            self._closing = True
            self.transport.write(http2_only_refusal(reply.body))
            self.transport.close()
            return
        delay = self._latency() if reply.delayed else 0.0
        if delay <= 0 and not self._queue:
            self._reply_now(reply, close=not keep_alive)
            self.busy = False
            return
        slot: list[bytes | None] = [None]
        self._queue.append(slot)
        close = not keep_alive
        asyncio.get_running_loop().call_later(max(delay, 0.0), self._ready, slot, reply, close)

    # output -----------------------------------------------------------------------
    def _too_large(self) -> None:
        if not self._closing:
            self._reply_now(
                Reply(413, ((b"content-type", b"text/plain"),), b"Request body too large"),
                close=True,
            )

    def _reply_now(self, reply: Reply, *, close: bool) -> None:
        close = close or self._closing
        self.transport.write(
            _head(reply.status, reply.headers, len(reply.body), close) + reply.body
        )
        if close:
            self._closing = True
            self.transport.close()

    def _ready(self, slot: list[bytes | None], reply: Reply, close: bool) -> None:
        slot[0] = _head(reply.status, reply.headers, len(reply.body), close) + reply.body
        if close:
            slot.append(None)  # marks "close after this one"
        while self._queue and self._queue[0][0] is not None:
            done = self._queue.popleft()
            if not self.transport.is_closing():
                self.transport.write(done[0] or b"")
            if len(done) > 1:
                self._closing = True
                self.transport.close()
                return
        if not self._queue:
            self.busy = False
            if self._closing:
                self.transport.close()
