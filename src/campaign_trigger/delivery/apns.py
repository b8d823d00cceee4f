"""APNs client: HTTP/2 ``POST {base}/3/device/{token}`` with an ES256 provider token.

Headers per request: ``authorization: bearer <jwt>``, ``apns-topic``, ``apns-push-type``
(``alert``, or ``background`` for a silent push), ``apns-priority`` (10; 5 for a
``normal`` priority or a silent push, as Apple requires), ``apns-expiration`` (now plus
the campaign's TTL, else a day), ``apns-id`` (a UUID kept
across retries of the same message, so APNs and the sandbox can tell a retry from a
second message) and ``apns-collapse-id`` (the message's identity on the device).
The JWT is reused for ``jwt_reuse_seconds``; on ``ExpiredProviderToken`` a new one is
minted and the message re-sent once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Final
from urllib.parse import quote

from campaign_trigger.delivery.auth import ApnsProviderTokens
from campaign_trigger.delivery.base import PushMessage, PushResult
from campaign_trigger.delivery.credentials import ApnsCredentials
from campaign_trigger.delivery.h2client import H2Pool
from campaign_trigger.delivery.mapping import Verdict, map_apns
from campaign_trigger.delivery.payload import apns_body
from campaign_trigger.delivery.sending import Answer, OnResult, RetryingSender
from campaign_trigger.store.models import Platform

DEFAULT_EXPIRATION_SECONDS: Final = 24 * 3600
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
    ) -> None:
        super().__init__(
            concurrency=concurrency,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
        )
        self.endpoint = credentials.base_url
        self.tokens = ApnsProviderTokens(credentials, reuse_seconds=jwt_reuse_seconds, clock=clock)
        connections = max_connections or max(2, -(-concurrency // STREAMS_PER_CONNECTION))
        self.pool = H2Pool(
            credentials.base_url,
            max_connections=connections,
            streams_per_connection=STREAMS_PER_CONNECTION,
            timeout_seconds=timeout_seconds,
            ca_file=credentials.ca_file,
        )
        self._topic = credentials.topic.encode()
        self._expiration = expiration_seconds
        self._ids: dict[int, bytes] = {}
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
            apns_id = self._ids[id(message)] = str(uuid.uuid4()).encode()
        options = message.options
        urgent = options.priority == "high" and not options.silent
        headers = [
            (b"authorization", self._auth_header),
            (b"apns-topic", self._topic),
            (b"apns-push-type", b"background" if options.silent else b"alert"),
            (b"apns-priority", b"10" if urgent else b"5"),
            (b"apns-expiration", self._expires(options.ttl_seconds)),
            (b"apns-id", apns_id),
        ]
        if message.collapse_id:
            headers.append((b"apns-collapse-id", message.collapse_id.encode("ascii")))
        path = b"/3/device/" + quote(message.token, safe="").encode()
        response = await self.pool.request(path, headers, body)
        retry_after = response.headers.get(b"retry-after")
        return Answer(
            response.status,
            response.body,
            retry_after.decode("latin-1") if retry_after else None,
            token,
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
