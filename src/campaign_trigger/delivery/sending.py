"""The send loop shared by the FCM and APNs clients: bounded concurrency and retries.

A provider subclass builds a payload (:meth:`RetryingSender._build`), posts it once
(:meth:`RetryingSender._post`) and maps the answer (:meth:`RetryingSender._map`);
this class runs at most ``concurrency`` sends at a time and decides what happens next:

* transient answers (429, 5xx, timeouts, connection errors) are retried after a
  backoff, or after ``Retry-After`` when the provider gives one, up to
  ``max_attempts`` tries in all, then ``FPErrPushFailed``;
* a stream the server never processed (GOAWAY above ``last_stream_id``, a refused
  stream) is re-sent at once on a new connection and does not count as a try;
* an expired credential is refreshed and the message re-sent once;
* a refused credential flags the app (:class:`ProviderEvents`), and every message
  still to send answers ``FPErrPushFailed`` without being sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from campaign_trigger.delivery.auth import AuthRefused, AuthUnavailable
from campaign_trigger.delivery.base import (
    FP_ERR_JSON_MARSHALLING,
    FP_ERR_PUSH_FAILED,
    PushMessage,
    PushResult,
)
from campaign_trigger.delivery.mapping import TRANSIENT, Verdict, retry_after_seconds
from campaign_trigger.delivery.payload import PayloadError
from campaign_trigger.store.models import Platform

log = logging.getLogger(__name__)


class TransportError(Exception):
    """The request failed on the wire (connection lost, timeout); it may be retried."""


class NotProcessed(Exception):
    """The server did not process the request (GOAWAY, refused stream): re-send it at once."""


class ProviderEvents(Protocol):
    """Where a provider reports what outlives one send: see ``delivery.registry``."""

    async def auth_failed(self) -> None:
        """The provider refused the app's credentials."""
        ...

    async def tokens_unregistered(self, tokens: Mapping[str, datetime]) -> None:
        """These push tokens came back unregistered at these times."""
        ...


@dataclass(frozen=True, slots=True)
class Answer:
    """One provider answer, and the credential the request carried."""

    status: int
    body: bytes
    retry_after: str | None
    credential: str


class RetryingSender(ABC):
    """Base of the push clients: implements :meth:`send_many` of the provider protocol."""

    platform: Platform

    def __init__(
        self,
        *,
        concurrency: int,
        max_attempts: int,
        events: ProviderEvents | None = None,
        backoff_base: float = 0.25,
        backoff_cap: float = 30.0,
        retry_after_cap: float = 60.0,
    ) -> None:
        self._concurrency = max(1, concurrency)
        self._max_attempts = max(1, max_attempts)
        self._events = events
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._retry_after_cap = retry_after_cap
        self._auth_failed = False
        self._auth_reported = False

    @property
    def auth_failed(self) -> bool:
        """True once the provider refused our credentials."""
        return self._auth_failed

    @abstractmethod
    def _build(self, message: PushMessage) -> bytes:
        """The request body; raises PayloadError when it cannot be sent."""

    @abstractmethod
    async def _post(self, message: PushMessage, body: bytes) -> Answer:
        """Send once; raises TransportError, NotProcessed, AuthRefused or AuthUnavailable."""

    @abstractmethod
    def _map(self, answer: Answer) -> Verdict:
        """What the answer means."""

    @abstractmethod
    def _refresh(self, credential: str) -> None:
        """Drop ``credential``: the next request gets a fresh one."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close connections."""

    async def send_many(self, messages: Sequence[PushMessage]) -> list[PushResult]:
        """Send every message; one result per message, in order; never raises per message."""
        results: list[PushResult | None] = [None] * len(messages)
        todo: list[tuple[int, PushMessage, bytes]] = []
        for index, message in enumerate(messages):
            try:
                todo.append((index, message, self._build(message)))
            except PayloadError:
                results[index] = PushResult(message.key, FP_ERR_JSON_MARSHALLING, None, None)
        work: Iterator[tuple[int, PushMessage, bytes]] = iter(todo)

        async def worker() -> None:
            for index, message, body in work:
                results[index] = await self._send_one(message, body)

        workers = min(self._concurrency, len(todo))
        if workers:
            await asyncio.gather(*(worker() for _ in range(workers)))
        done = [result for result in results if result is not None]
        gone = {
            message.token: result.unregistered_at
            for message, result in zip(messages, done, strict=True)
            if result.unregistered_at is not None
        }
        if gone and self._events is not None:
            await self._events.tokens_unregistered(gone)
        if self._auth_failed and not self._auth_reported and self._events is not None:
            self._auth_reported = True
            await self._events.auth_failed()
        return done

    def _failed(self, message: PushMessage) -> PushResult:
        return PushResult(message.key, FP_ERR_PUSH_FAILED, None, None)

    def _flag_auth(self, why: str) -> None:
        if not self._auth_failed:
            log.error("%s provider refused the app's credentials: %s", self.platform.value, why)
        self._auth_failed = True

    async def _send_one(self, message: PushMessage, body: bytes) -> PushResult:
        tries = 0
        not_processed = 0
        refreshed = False
        while True:
            if self._auth_failed:
                return self._failed(message)
            retry_after: str | None = None
            try:
                answer = await self._post(message, body)
            except NotProcessed:
                not_processed += 1
                if not_processed <= 4 * self._max_attempts:
                    continue
                verdict = TRANSIENT
            except AuthRefused as exc:
                self._flag_auth(str(exc))
                return self._failed(message)
            except (TransportError, AuthUnavailable, TimeoutError):
                verdict = TRANSIENT
            else:
                verdict = self._map(answer)
                retry_after = answer.retry_after
                if verdict.refresh_auth:
                    if not refreshed:
                        refreshed = True
                        self._refresh(answer.credential)
                        continue
                    verdict = Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=verdict.reason)
            if verdict.auth_failed:
                self._flag_auth(verdict.reason)
                return self._failed(message)
            if verdict.retry:
                tries += 1
                if tries >= self._max_attempts:
                    return self._failed(message)
                await asyncio.sleep(self._delay(tries, retry_after))
                continue
            if not verdict.error_message:
                return PushResult(message.key, "", datetime.now(UTC), None)
            return PushResult(message.key, verdict.error_message, None, verdict.unregistered_at)

    def _delay(self, tries: int, retry_after: str | None) -> float:
        asked = retry_after_seconds(retry_after)
        if asked is not None:
            return float(min(asked, self._retry_after_cap))
        backoff: float = min(self._backoff_cap, self._backoff_base * 2.0 ** (tries - 1))
        return backoff * random.uniform(0.5, 1.0)
