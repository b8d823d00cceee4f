"""APNs client: HTTP/2 ``POST {base}/3/device/{token}`` with an ES256 provider token.

Headers per request: ``authorization: bearer <jwt>``, ``apns-topic``, ``apns-push-type``
(``alert``, or ``background`` for a silent push), ``apns-priority`` (10; 5 for a
``normal`` priority or a silent push, as Apple requires), ``apns-expiration`` (now plus
the campaign's TTL, else a day), ``apns-id`` (a UUID kept
across retries of the same message, so APNs and the sandbox can tell a retry from a
second message) and ``apns-collapse-id`` (the message's identity on the device).
The JWT is reused for ``jwt_reuse_seconds``; on ``ExpiredProviderToken`` a new one is
minted and the message re-sent once.

Before a chunk's send time the provider signs its token and opens its connection
(:meth:`ApnsProvider.prepare`).

The HTTP/2 transport is libcurl's (``curl_h2.CurlPool``: nghttp2 and OpenSSL in C);
``http2="h2"`` selects the earlier pure-Python client (``h2client.H2Pool``), also the
fallback when pycurl's libcurl was built without HTTP/2. Both keep GOAWAY semantics
(unprocessed streams re-sent once, on a new connection) and the server's stream limit.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import quote

from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.auth import ApnsProviderTokens
from campaign_trigger.delivery.base import PushMessage, PushOptions, PushResult
from campaign_trigger.delivery.credentials import ApnsCredentials
from campaign_trigger.delivery.curl_h2 import CurlPool, CurlResponse, http2_supported
from campaign_trigger.delivery.h2client import H2Pool
from campaign_trigger.delivery.mapping import Verdict, map_apns
from campaign_trigger.delivery.payload import apns_body
from campaign_trigger.delivery.sending import Answer, OnResult, RetryingSender
from campaign_trigger.store.models import Platform

DEFAULT_EXPIRATION_SECONDS: Final = 24 * 3600
_PLAIN_TOKEN: Final = re.compile(rb"[A-Za-z0-9_.~-]+")  # nothing to percent-encode
STREAMS_PER_CONNECTION: Final = 100


class ApnsProvider(RetryingSender):
    """Push to iOS devices through APNs (token-based authentication)."""

    platform = Platform.ios

    def __init__(
        self,
        credentials: ApnsCredentials,
        *,
        concurrency: int = 256,
        max_attempts: int = 4,
        timeout_seconds: float = 10.0,
        max_connections: int | None = None,
        jwt_reuse_seconds: float = 40 * 60,
        expiration_seconds: int = DEFAULT_EXPIRATION_SECONDS,
        clock: Callable[[], float] = time.time,
        backoff_base: float = 0.25,
        http2: Literal["curl", "h2"] = "curl",
    ) -> None:
        super().__init__(
            concurrency=concurrency,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
        )
        self.endpoint = credentials.base_url
        self.tokens = ApnsProviderTokens(credentials, reuse_seconds=jwt_reuse_seconds, clock=clock)
        connections = max_connections or max(2, -(-concurrency // STREAMS_PER_CONNECTION))
        pool_options = {
            "max_connections": connections,
            "streams_per_connection": STREAMS_PER_CONNECTION,
            "timeout_seconds": timeout_seconds,
            "ca_file": credentials.ca_file,
        }
        self.pool: CurlPool | H2Pool
        if http2 == "curl" and http2_supported():
            self.pool = CurlPool(credentials.base_url, **pool_options)  # type: ignore[arg-type]
        else:
            self.pool = H2Pool(credentials.base_url, **pool_options)  # type: ignore[arg-type]
        self._topic = credentials.topic.encode()
        self._shared: tuple[str | None, PushOptions | None, bytes, list[bytes]] = (
            None, None, b"", []
        )  # fmt: skip
        self._expiration = expiration_seconds
        self._ids: dict[int, bytes] = {}
        self._apns_prefix = str(uuid.uuid4())[:24].encode()  # "xxxxxxxx-xxxx-4xxx-yxxx-"
        self._apns_counter = 0
        self._auth_header = b""
        self._auth_token = ""
        self._expires_key = (0, 0)
        self._expires_value = b""

    async def _ready(self) -> None:
        """The provider token (signed here) and a connection to APNs, its stream limit
        known: what a first send would wait for after the send time (a TLS handshake and
        a round trip to Apple)."""
        self.tokens.get()
        await self.pool.warm()

    def _build(self, message: PushMessage) -> bytes:
        return apns_body(message)

    async def _post(self, message: PushMessage, body: bytes) -> Answer:
        token = self.tokens.get()
        apns_id = self._ids.get(id(message))
        if apns_id is None:
            apns_id = self._ids[id(message)] = self._new_apns_id()
        if isinstance(self.pool, CurlPool):
            path, lines = self._curl_request(message, apns_id, token)
            answer = await self.pool.request(path, lines, body)
            return _answer(answer, token)
        options = message.options
        urgent = options.priority == "high" and not options.silent
        headers = [
            (b"authorization", self._bearer(token)),
            (b"apns-push-type", b"background" if options.silent else b"alert"),
            (b"apns-priority", b"10" if urgent else b"5"),
            (b"apns-expiration", self._expires(options.ttl_seconds)),
            (b"apns-id", apns_id),
        ]
        if message.collapse_id:
            headers.append((b"apns-collapse-id", message.collapse_id.encode("ascii")))
        headers.append((b"apns-topic", self._topic))
        response = await self.pool.request(_path(message), headers, body)
        header = response.headers.get(b"retry-after")
        return Answer(
            response.status, response.body, header.decode("latin-1") if header else None, token
        )

    def _bearer(self, token: str) -> bytes:
        if token != self._auth_token:
            self._auth_header, self._auth_token = f"bearer {token}".encode(), token
        return self._auth_header

    def _curl_request(
        self, message: PushMessage, apns_id: bytes, token: str
    ) -> tuple[bytes, list[bytes]]:
        """Path and header lines for libcurl: the lines every message of the same
        options shares are built once per JWT and second (``apns-expiration``)."""
        options = message.options
        expires = self._expires(options.ttl_seconds)
        shared = self._shared
        if shared[0] is not token or shared[1] is not options or shared[2] is not expires:
            urgent = options.priority == "high" and not options.silent
            lines = [
                b"authorization: " + self._bearer(token),
                b"apns-push-type: " + (b"background" if options.silent else b"alert"),
                b"apns-priority: " + (b"10" if urgent else b"5"),
                b"apns-expiration: " + expires,
                b"apns-topic: " + self._topic,
                # empty values drop the headers libcurl would add
                b"content-type:",
                b"accept:",
            ]
            shared = self._shared = (token, options, expires, lines)
        lines = [*shared[3], b"apns-id: " + apns_id]
        if message.collapse_id:
            lines.append(b"apns-collapse-id: " + message.collapse_id.encode("ascii"))
        return _path(message), lines

    def _expires(self, ttl_seconds: int | None) -> bytes:
        """``apns-expiration``: a UNIX time; 0 (a TTL of 0) asks for one attempt only."""
        if ttl_seconds == 0:
            return b"0"
        now = int(time.time())
        seconds = self._expiration if ttl_seconds is None else ttl_seconds
        if (now, seconds) != self._expires_key:
            self._expires_key = (now, seconds)
            self._expires_value = str(now + seconds).encode()
        return self._expires_value

    def _new_apns_id(self) -> bytes:
        """A version-4 UUID: this provider's random 80 bits, then a 48-bit counter
        (uuid4() costs more than the rest of building a request)."""
        self._apns_counter += 1
        return self._apns_prefix + b"%012x" % (self._apns_counter & 0xFFFFFFFFFFFF)

    async def _send_all(
        self,
        messages: Sequence[PushMessage],
        bodies: Sequence[bytes | None],
        sendable: int,
        results: list[PushResult | None],
        on_result: OnResult | None,
    ) -> None:
        if isinstance(self.pool, CurlPool):
            await _CurlBatch(self, self.pool, messages, bodies, sendable, results, on_result).run()
        else:
            await super()._send_all(messages, bodies, sendable, results, on_result)

    def _map(self, answer: Answer) -> Verdict:
        return map_apns(answer.status, answer.body)

    def _refresh(self, credential: str) -> None:
        self.tokens.renew(credential)

    async def send_many(
        self, messages: Sequence[PushMessage], *, on_result: OnResult | None = None
    ) -> list[PushResult]:
        """Send every message (see :meth:`RetryingSender.send_many`); apns-ids live per call."""
        try:
            return await super().send_many(messages, on_result=on_result)
        finally:
            if self._ids:  # the messages retried (libcurl) or all of them (h2)
                for message in messages:
                    self._ids.pop(id(message), None)

    async def aclose(self) -> None:
        """Close the HTTP/2 connections."""
        await self.pool.aclose()


def _path(message: PushMessage) -> bytes:
    token = message.token
    if token.isascii() and token.isalnum():  # APNs' own form, hex digits: as it is
        return b"/3/device/" + token.encode()
    encoded = token.encode()
    if not _PLAIN_TOKEN.fullmatch(encoded):
        encoded = quote(token, safe="").encode()
    return b"/3/device/" + encoded


def _answer(response: CurlResponse, token: str) -> Answer:
    retry_after = None if response.retry_after is None else str(response.retry_after)
    return Answer(response.status, response.body, retry_after, token)


class _CurlBatch:
    """One :meth:`ApnsProvider.send_many` on libcurl without a coroutine per message.

    Each message's first try is started from libcurl's callbacks as a slot frees, and
    its answer judged there: a final one (sent, or refused for good) is the result at
    once. Anything else — a retry, an expired JWT, a refusal of the credentials, a
    failed stream — goes on in a task running :meth:`RetryingSender._send_one` from that
    first outcome. The results settled at once go to ``on_result`` through a few
    long-lived recorder tasks (``_recorder``). Slots as in
    :meth:`RetryingSender._send_all`: one per message from its send until its result
    is recorded; all given back when the call ends, even cancelled.

    A message in flight holds one tuple of plain values (``CurlPool.start``'s tag) and
    nothing else the garbage collector tracks: objects living as long as a request are
    what set off its full collections, tens of ms each (docs/benchmarks.md).
    """

    def __init__(
        self,
        provider: ApnsProvider,
        pool: CurlPool,
        messages: Sequence[PushMessage],
        bodies: Sequence[bytes | None],
        sendable: int,
        results: list[PushResult | None],
        on_result: OnResult | None,
    ) -> None:
        self._provider = provider
        self._pool = pool
        self._slots = provider._slots
        self._messages = messages
        self._bodies = bodies
        self._next = 0  # the next index to look at
        self._results = results
        self._on_result = on_result
        self._left = sendable
        self._held = 0  # slots this call holds
        self._waiter: asyncio.Future[None] | None = None  # queued for a slot
        self._pumping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_record: deque[PushResult] = deque()  # settled at once, for on_result
        self._idle: list[asyncio.Future[None]] = []  # recorders waiting for one
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answer_cb = self._answered  # one bound method for every request

    async def run(self) -> None:
        try:
            self._pump()
            await self._done
        finally:
            self._close()

    def _close(self) -> None:
        if not self._done.done():
            self._done.cancel()  # late answers find the call over
        waiter = self._waiter
        if waiter is not None:
            if waiter.done() and not waiter.cancelled():
                self._held += 1  # handed a slot its callback has not taken yet
            waiter.cancel()
        for task in self._tasks:
            task.cancel()
        for _ in range(self._held):
            self._slots.release()
        self._held = 0

    def _pump(self, granted: bool = False) -> None:
        """Start messages while slots are free (``granted``: one was handed to this call);
        else queue for the next one."""
        if self._pumping:  # a message settled as it was launched: the loop below goes on
            return
        self._pumping = True
        try:
            bodies = self._bodies
            while self._waiter is None and not self._done.done():
                index = self._next
                while index < len(bodies) and bodies[index] is None:
                    index += 1
                if index >= len(bodies) or freeze.FENCED:  # fenced: no new message
                    break
                if not granted and not self._slots.try_acquire():
                    self._waiter = self._slots.wait()
                    self._waiter.add_done_callback(self._granted)
                    return
                granted = False
                self._held += 1
                self._next = index + 1
                self._launch(index)
            if granted:
                self._slots.release()
        finally:
            self._pumping = False

    def _granted(self, waiter: asyncio.Future[None]) -> None:
        self._waiter = None
        if not waiter.cancelled() and not self._done.done():
            self._pump(granted=True)

    def _launch(self, index: int) -> None:
        message, body = self._messages[index], self._bodies[index]
        assert body is not None
        provider = self._provider
        if provider.auth_failed:
            self._settle(index, provider._failed(message, provider._auth_reason))
            return
        apns_id = provider._new_apns_id()
        try:
            token = provider.tokens.get()
            path, lines = provider._curl_request(message, apns_id, token)
            tag = (index, apns_id, token, time.perf_counter())
            self._pool.start(path, lines, body, self._answer_cb, tag)
        except Exception as exc:  # judged as _send_one judges what _post raises
            self._continue(index, apns_id, exc)

    def _answered(
        self, tag: tuple[int, bytes, str, float], outcome: CurlResponse | Exception
    ) -> None:
        if self._done.done():
            return
        index, apns_id, token, started = tag
        try:
            if isinstance(outcome, Exception):
                self._continue(index, apns_id, outcome)
                return
            provider = self._provider
            provider._latency.observe(time.perf_counter() - started)
            if outcome.status == 200:  # sent (map_apns): the result at once
                key = self._messages[index].key
                self._settle(index, PushResult(key, "", datetime.now(UTC), None))
                return
            answer = _answer(outcome, token)
            result = provider._final(self._messages[index], answer)
            if result is None:
                self._continue(index, apns_id, answer)
            else:
                self._settle(index, result)
        except Exception as exc:  # never into libcurl's callbacks: the call raises it
            self._done.set_exception(exc)

    def _continue(self, index: int, apns_id: bytes, first: Answer | Exception) -> None:
        """The rest of the message's tries in a task (same apns-id)."""
        message = self._messages[index]
        self._provider._ids[id(message)] = apns_id
        self._spawn(self._finish_slowly(index, first))

    async def _finish_slowly(self, index: int, first: Answer | Exception) -> None:
        body = self._bodies[index]
        assert body is not None
        result = await self._provider._send_one(self._messages[index], body, first)
        self._results[index] = result
        if self._on_result is not None:
            await self._on_result(result)
        self._finished()

    def _settle(self, index: int, result: PushResult) -> None:
        self._results[index] = result
        if self._on_result is None:
            self._finished()
            return
        self._to_record.append(result)
        if self._idle:
            self._idle.pop().set_result(None)
        else:
            self._spawn(self._recorder(self._on_result))

    async def _recorder(self, on_result: OnResult) -> None:
        """Await ``on_result`` for the results settled at once, then wait for more: a
        few of these for the whole call, as many as results are being recorded at a
        time, rather than a task per message (its creation, its coroutine, its end
        callback: a few µs each, and GC-tracked while the outcome awaits its commit)."""
        to_record = self._to_record
        loop = asyncio.get_running_loop()
        while True:
            while to_record:  # woken for one result, it may find another lane took it
                await on_result(to_record.popleft())
                self._finished()
            idle = loop.create_future()
            self._idle.append(idle)
            await idle

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._done.done():
            return
        error = task.exception()
        if error is not None:  # on_result raised: the call raises it
            self._done.set_exception(error)

    def _finished(self) -> None:
        """A message's result is recorded: its slot goes to the next message (this call's
        own when no other call waits for one)."""
        if self._done.done():
            return
        self._held -= 1
        self._left -= 1
        if self._left == 0:
            self._slots.release()
            self._done.set_result(None)
        elif self._pumping or self._slots.waiting():
            self._slots.release()
            self._pump()
        else:
            self._pump(granted=True)
