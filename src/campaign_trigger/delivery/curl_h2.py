"""APNs' HTTP/2 transport on libcurl (pycurl): one multi handle driven by the asyncio loop.

Why libcurl: framing, HPACK, flow control and TLS run in C (nghttp2 and OpenSSL,
bundled in pycurl's wheels), so a request costs a handful of Python calls instead of
``h2``'s state machine (``docs/benchmarks.md``, "APNs on a C HTTP/2 stack"). The pool's
``CurlMulti`` multiplexes up to ``streams_per_connection`` streams on each of at most
``max_connections`` connections and queues the rest; the loop watches the sockets
libcurl asks for (``M_SOCKETFUNCTION``) and runs its timer (``M_TIMERFUNCTION``).

GOAWAY (RFC 9113 §6.8): streams above ``last_stream_id`` were not processed and
libcurl re-sends them on a new connection itself; streams at or below it finish on
the old connection. A stream that fails otherwise (connection lost, reset, timeout)
is a :class:`~campaign_trigger.delivery.sending.TransportError` or a
:class:`TimeoutError`, which the caller retries with backoff like any transient error.

Freezes: libcurl writes the streams of many requests in one of its turns, in C. A
worker frozen in the middle of that turn (``delivery/freeze.py``) would let the rest of
them out as it resumes, after its runs were taken over: so each request's body is
handed to libcurl by a read callback that checks for a freeze first (:class:`_Body`),
right before that stream's body is written, and a request libcurl has not read is not
sent. A freeze caught after a check lets out what libcurl had taken and not yet written:
that one stream, as a rule.

Stream limit: libcurl respects the server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` once
it has it, but assumes 100 on a new connection before; so the pool's first request goes
alone, and the burst follows once the server's limit is known.

``http://`` URLs speak HTTP/2 with prior knowledge (the sandbox's cleartext port);
``https://`` URLs TLS with ALPN ``h2``, trusting the system CAs and ``ca_file``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pycurl

from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.sending import TransportError

_TIMED_OUT = 28  # CURLE_OPERATION_TIMEDOUT


@dataclass(slots=True)  # not frozen: one per request, and a frozen one costs 3x to make
class CurlResponse:
    """A complete answer: status, ``Retry-After`` in seconds (None if absent), body."""

    status: int
    retry_after: int | None
    body: bytes


Tag = TypeVar("Tag")

_SEEK_SET, _SEEK_OK, _SEEK_FAIL = 0, 0, 1  # SEEK_SET; CURL_SEEKFUNC_OK, CURL_SEEKFUNC_FAIL


class _Body:
    """A handle's request body, read by libcurl as it writes the stream: one per handle,
    kept with it (nothing per request for the garbage collector). ``seek`` lets libcurl
    send the body again (a stream a GOAWAY left unprocessed goes again on a new
    connection)."""

    __slots__ = ("data", "sent")

    def __init__(self) -> None:
        self.data = b""
        self.sent = 0

    def read(self, size: int) -> bytes:
        freeze.check()  # this stream is about to go: not after a freeze too long
        start, self.sent = self.sent, min(self.sent + size, len(self.data))
        return self.data[start : self.sent]  # the body itself when whole (no copy)

    def seek(self, offset: int, origin: int) -> int:
        if origin != _SEEK_SET or not 0 <= offset <= len(self.data):
            return _SEEK_FAIL
        self.sent = offset
        return _SEEK_OK


def http2_supported() -> bool:
    """True when the libcurl under pycurl was built with HTTP/2 (nghttp2)."""
    return bool(pycurl.version_info()[4] & pycurl.VERSION_HTTP2)


class CurlPool:
    """HTTP/2 requests to one origin over libcurl's multiplexed connections."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 4,
        streams_per_connection: int = 100,
        timeout_seconds: float = 10.0,
        ca_file: str | Path | None = None,
    ) -> None:
        if not http2_supported():
            raise RuntimeError(f"libcurl without HTTP/2: {pycurl.version}")
        self._base = base_url.rstrip("/").encode()
        self._https = base_url.startswith("https:")
        self._timeout_ms = max(1, int(timeout_seconds * 1000))
        self._ca_file = str(ca_file) if ca_file is not None and Path(ca_file).exists() else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_PIPELINING, pycurl.PIPE_MULTIPLEX)
        self._multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, max_connections)
        self._multi.setopt(pycurl.M_MAX_CONCURRENT_STREAMS, streams_per_connection)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        # A handle's state is kept here, not in attributes of the handle: pycurl looks
        # those up only after a failed generic lookup, an AttributeError raised and
        # cleared at each read (~2,000 instructions: 3 reads a request were ~4 % of it).
        self._free: list[pycurl.Curl] = []
        self._active: dict[pycurl.Curl, tuple[Any, Any]] = {}  # handle → its done, tag
        self._bodies: dict[pycurl.Curl, list[bytes]] = {}  # handle → its answer's chunks
        self._requests: dict[pycurl.Curl, _Body] = {}  # handle → its request's body
        self._watched: dict[int, int] = {}  # fd → the events the loop watches it for
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._closed = False
        self.connections_opened = 0
        self._warm = False
        self._probing = False
        self._held: list[tuple[bytes, list[bytes], bytes, Any, Any]] = []  # behind the first

    # libcurl → the loop ---------------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        loop = self._loop
        assert loop is not None
        before = self._watched.get(fd, 0)
        wanted = 0 if what == pycurl.POLL_REMOVE else what
        if before & pycurl.POLL_IN and not wanted & pycurl.POLL_IN:
            loop.remove_reader(fd)
        if before & pycurl.POLL_OUT and not wanted & pycurl.POLL_OUT:
            loop.remove_writer(fd)
        if wanted & pycurl.POLL_IN and not before & pycurl.POLL_IN:
            loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
        if wanted & pycurl.POLL_OUT and not before & pycurl.POLL_OUT:
            loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
        if wanted:
            self._watched[fd] = wanted
        else:
            self._watched.pop(fd, None)

    def _on_timer(self, timeout_ms: int) -> None:
        loop = self._loop
        assert loop is not None
        if self._timer is not None:
            if timeout_ms == 0 and not isinstance(self._timer, asyncio.TimerHandle):
                return  # a run is already due this turn
            self._timer.cancel()
            self._timer = None
        if timeout_ms == 0:
            self._timer = loop.call_soon(self._act, pycurl.SOCKET_TIMEOUT, 0)
        elif timeout_ms > 0:
            self._timer = loop.call_later(timeout_ms / 1000, self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        if fd == pycurl.SOCKET_TIMEOUT:
            self._timer = None
        if self._closed:
            return
        if self._active:  # libcurl may write a request now: not after a freeze too long
            freeze.check()
        self._multi.socket_action(fd, events)
        while True:
            queued, done, failed = self._multi.info_read()
            for easy in done:
                self._finish(easy, None)
            for easy, code, message in failed:
                error: Exception = (
                    TimeoutError(message) if code == _TIMED_OUT else TransportError(message)
                )
                self._finish(easy, error)
            if not queued:
                break

    def _finish(self, easy: pycurl.Curl, error: Exception | None) -> None:
        self._multi.remove_handle(easy)
        done, tag = self._active.pop(easy)
        self.connections_opened += easy.getinfo(pycurl.NUM_CONNECTS)
        chunks = self._bodies[easy]
        body = b""
        if chunks:
            body = b"".join(chunks)
            chunks.clear()
        outcome: CurlResponse | Exception
        if error is not None:
            outcome = error
        else:
            status = easy.getinfo(pycurl.RESPONSE_CODE)
            retry_after = easy.getinfo(pycurl.RETRY_AFTER) if status != 200 else 0
            outcome = CurlResponse(status, retry_after if retry_after > 0 else None, body)
        self._free.append(easy)  # free before done(): it may start the next request
        done(tag, outcome)

    # requests -------------------------------------------------------------------
    def _easy(self) -> pycurl.Curl:
        if self._free:
            return self._free.pop()
        easy = pycurl.Curl()
        chunks: list[bytes] = []
        self._bodies[easy] = chunks
        easy.setopt(pycurl.WRITEFUNCTION, chunks.append)
        request = self._requests[easy] = _Body()
        easy.setopt(pycurl.POST, 1)
        easy.setopt(pycurl.READFUNCTION, request.read)
        easy.setopt(pycurl.SEEKFUNCTION, request.seek)
        easy.setopt(pycurl.NOSIGNAL, 1)
        easy.setopt(pycurl.PIPEWAIT, 1)  # wait for a multiplexed stream, not a new connection
        easy.setopt(pycurl.TIMEOUT_MS, self._timeout_ms)
        easy.setopt(pycurl.CONNECTTIMEOUT_MS, self._timeout_ms)
        if self._https:
            easy.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2TLS)
            if self._ca_file is not None:
                easy.setopt(pycurl.CAINFO, self._ca_file)
            system = ssl.get_default_verify_paths()
            if system.capath:
                easy.setopt(pycurl.CAPATH, system.capath)
        else:
            easy.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE)
        return easy

    async def request(self, path: bytes, headers: list[bytes], body: bytes) -> CurlResponse:
        """POST ``body`` to ``path`` with ``headers`` (``b"name: value"`` lines); raises
        TransportError or TimeoutError."""
        future: asyncio.Future[CurlResponse] = asyncio.get_running_loop().create_future()
        self.start(path, headers, body, _settle, future)
        return await future

    def start(
        self,
        path: bytes,
        headers: list[bytes],
        body: bytes,
        done: Callable[[Tag, CurlResponse | Exception], None],
        tag: Tag,
    ) -> None:
        """POST as :meth:`request` does, without a coroutine: ``done(tag, outcome)`` is
        called once with the answer, or its TransportError or TimeoutError, from the
        loop's callbacks (never from within ``start``). It must not raise.

        Nothing is allocated per request that the garbage collector tracks (``tag``
        aside): at thousands of requests a second, objects that live as long as a
        request are what sets off its full collections."""
        if self._closed:
            raise TransportError("pool closed")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if not self._warm:
            # Before the server's SETTINGS arrive, libcurl assumes 100 streams and may
            # open more than the server allows (they come back refused and are re-sent on
            # new connections, which do the same): the first request goes alone.
            if self._probing:
                self._held.append((path, headers, body, done, tag))
                return
            self._probing = True
            self._add(path, headers, body, self._warmed, (done, tag))
            return
        self._add(path, headers, body, done, tag)

    async def warm(self) -> None:
        """Open a connection and learn the server's stream limit now, unless a request did:
        the first request after this one need neither wait for them nor go alone. libcurl
        opens no connection it would reuse without a request (one a pre-request callback
        aborts is closed), so this is one: ``POST /`` with an empty body, which names no
        device and which APNs answers 404 ``BadPath``. Raises as :meth:`request`."""
        if self._warm or self._probing:
            return
        await self.request(b"/", [b"content-type:", b"accept:"], b"")

    def _warmed(self, first: tuple[Any, Any], outcome: CurlResponse | Exception) -> None:
        self._warm = True
        held, self._held = self._held, []
        for request in held:
            self._add(*request)
        done, tag = first
        done(tag, outcome)

    def _add(self, path: bytes, headers: list[bytes], body: bytes, done: Any, tag: Any) -> None:
        easy = self._easy()
        easy.setopt(pycurl.URL, self._base + path)
        easy.setopt(pycurl.HTTPHEADER, headers)
        request = self._requests[easy]
        request.data, request.sent = body, 0
        easy.setopt(pycurl.POSTFIELDSIZE, len(body))
        self._active[easy] = (done, tag)
        self._multi.add_handle(easy)

    async def aclose(self) -> None:
        """Fail what is in flight, close the connections."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        active, self._active = self._active, {}
        held, self._held = self._held, []
        for easy in active:
            self._multi.remove_handle(easy)
        for done, tag in [*active.values(), *((request[3], request[4]) for request in held)]:
            done(tag, TransportError("pool closed"))
        for easy in self._free:
            easy.close()
        self._free.clear()
        self._bodies.clear()
        self._requests.clear()
        self._multi.close()
        if self._loop is not None:
            for fd in self._watched:
                self._loop.remove_reader(fd)
                self._loop.remove_writer(fd)
        self._watched.clear()


def _settle(future: asyncio.Future[CurlResponse], outcome: CurlResponse | Exception) -> None:
    if future.done():  # the caller stopped waiting
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
