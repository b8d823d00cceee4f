"""APNs client: HTTP/2 ``POST {base}/3/device/{token}`` with an ES256 provider token.

Headers per request: ``authorization: bearer <jwt>``, ``apns-topic``, ``apns-push-type``
(``alert``, or ``background`` for a silent push), ``apns-priority`` (10; 5 for a
``normal`` priority or a silent push, as Apple requires), ``apns-expiration`` (now plus
the campaign's TTL, else a day), ``apns-id`` (a UUID kept
across retries of the same message, so APNs and the sandbox can tell a retry from a
second message) and ``apns-collapse-id`` (the message's identity on the device).
The JWT is reused for ``jwt_reuse_seconds``; on ``ExpiredProviderToken`` a new one is
minted and the message re-sent once.

The HTTP/2 transport is libcurl's (``curl_h2.CurlPool``: nghttp2 and OpenSSL in C);
``http2="h2"`` selects the earlier pure-Python client (``h2client.H2Pool``), also the
fallback when pycurl's libcurl was built without HTTP/2. Both keep GOAWAY semantics
(unprocessed streams re-sent once, on a new connection) and the server's stream limit.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Final, Literal
from urllib.parse import quote

from campaign_trigger.delivery.auth import ApnsProviderTokens
from campaign_trigger.delivery.base import PushMessage, PushResult
from campaign_trigger.delivery.credentials import ApnsCredentials
from campaign_trigger.delivery.curl_h2 import CurlPool, http2_supported
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
        # libcurl takes "name: value" lines; empty values drop the headers it would add
        self._curl_headers = [b"apns-topic: " + self._topic, b"content-type:", b"accept:"]
        self._expiration = expiration_seconds
        self._ids: dict[int, bytes] = {}
        self._apns_prefix = str(uuid.uuid4())[:24].encode()  # "xxxxxxxx-xxxx-4xxx-yxxx-"
        self._apns_counter = 0
        self._auth_header = b""
        self._auth_token = ""
        self._expires_key = (0, 0)
        self._expires_value = b""

    def _build(self, message: PushMessage) -> bytes:
        return apns_body(message)

    async def _post(self, message: PushMessage, body: bytes) -> Answer:
        token = self.tokens.get()
        if token != self._auth_token:
            self._auth_header, self._auth_token = f"bearer {token}".encode(), token
        apns_id = self._ids.get(id(message))
        if apns_id is None:
            apns_id = self._ids[id(message)] = self._new_apns_id()
        options = message.options
        urgent = options.priority == "high" and not options.silent
        headers = [
            (b"authorization", self._auth_header),
            (b"apns-push-type", b"background" if options.silent else b"alert"),
            (b"apns-priority", b"10" if urgent else b"5"),
            (b"apns-expiration", self._expires(options.ttl_seconds)),
            (b"apns-id", apns_id),
        ]
        if message.collapse_id:
            headers.append((b"apns-collapse-id", message.collapse_id.encode("ascii")))
        token_bytes = message.token.encode()
        if not _PLAIN_TOKEN.fullmatch(token_bytes):
            token_bytes = quote(message.token, safe="").encode()
        path = b"/3/device/" + token_bytes
        if isinstance(self.pool, CurlPool):
            lines = [name + b": " + value for name, value in headers]
            answer = await self.pool.request(path, [*lines, *self._curl_headers], body)
            retry_after = None if answer.retry_after is None else str(answer.retry_after)
            return Answer(answer.status, answer.body, retry_after, token)
        headers.append((b"apns-topic", self._topic))
        response = await self.pool.request(path, headers, body)
        header = response.headers.get(b"retry-after")
        return Answer(
            response.status, response.body, header.decode("latin-1") if header else None, token
        )

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
            for message in messages:
                self._ids.pop(id(message), None)

    async def aclose(self) -> None:
        """Close the HTTP/2 connections."""
        await self.pool.aclose()
