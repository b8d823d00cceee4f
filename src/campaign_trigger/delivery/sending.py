"""The send loop shared by the FCM and APNs clients: bounded concurrency and retries.

A provider subclass builds a payload (:meth:`RetryingSender._build`), posts it once
(:meth:`RetryingSender._post`) and maps the answer (:meth:`RetryingSender._map`);
this class runs at most ``concurrency`` sends at a time and decides what happens next.

The ``concurrency`` slots belong to the provider, not to one call: concurrent
:meth:`RetryingSender.send_many` calls of one provider share them. A slot is taken
before a message is sent and given back only once the caller's ``on_result`` has
returned — the delivery service returns from it once the outcome is recorded — so
at no moment are more than ``concurrency`` messages sent and not yet recorded: after
a crash, at most that many can go twice.

* transient answers (429, 5xx, timeouts, connection errors) are retried after a
  backoff, or after ``Retry-After`` when the provider gives one, up to
  ``max_attempts`` tries in all, then ``FPErrPushFailed``;
* a stream the server never processed (GOAWAY above ``last_stream_id``, a refused
  stream) is re-sent at once on a new connection and does not count as a try;
* an expired credential is refreshed and the message re-sent once;
* a refused credential sets :attr:`RetryingSender.auth_failed`, and every message
  still to send answers ``FPErrPushFailed`` without being sent.

What outlives a send — a token that came back unregistered (``PushResult.unregistered_at``),
refused credentials — is for the caller to record: this package holds no database.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from campaign_trigger import metrics
from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.auth import AuthRefused, AuthUnavailable
from campaign_trigger.delivery.base import (
    FP_ERR_JSON_MARSHALLING,
    FP_ERR_PUSH_FAILED,
    PushMessage,
    PushResult,
)
from campaign_trigger.delivery.mapping import Verdict, retry_after_seconds
from campaign_trigger.delivery.payload import PayloadError
from campaign_trigger.store.models import Platform

log = logging.getLogger(__name__)

# The retries' jitter draws from a generator of its own: the global one is the
# application's (a test seeding it, Hypothesis checking it is left alone).
_JITTER = random.Random()


class TransportError(Exception):
    """The request failed on the wire (connection lost, timeout); it may be retried."""


class NotProcessed(Exception):
    """The server did not process the request (GOAWAY, refused stream): re-send it at once."""


OnResult = Callable[[PushResult], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Answer:
    """One provider answer, and the credential the request carried."""

    status: int
    body: bytes
    retry_after: str | None
    credential: str


class Slots:
    """``count`` slots handed out first come, first served (an ``asyncio.Semaphore``
    in O(1)).

    ``asyncio.Semaphore`` (Python 3.11) wakes the next waiter by walking its queue from
    the head past every waiter already woken that has not run yet: with a worker's
    chunks sharing a provider's slots (hundreds of waiters), that walk cost ~20 % of a
    chunk's CPU (docs/benchmarks.md, "A million in a minute"). Here a release hands
    its slot straight to the first waiter still waiting and drops it from the queue.
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        """Take a free slot now, if there is one."""
        if self._free:  # a free slot means nobody is waiting: release hands them over
            self._free -= 1
            return True
        return False

    def waiting(self) -> bool:
        """True when someone may be queued for a slot."""
        return bool(self._waiters)

    def wait(self) -> asyncio.Future[None]:
        """Queue for the next slot given back: the future's result means it is the
        caller's (the caller cancels it to leave the queue)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        waiter = self.wait()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot while being cancelled: pass it on
            raise  # a cancelled waiter left in the queue is skipped by release

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class RetryingSender(ABC):
    """Base of the push clients: implements :meth:`send_many` of the provider protocol."""

    platform: Platform
    endpoint: str = ""

    def __init__(
        self,
        *,
        concurrency: int,
        max_attempts: int,
        backoff_base: float = 0.25,
        backoff_cap: float = 30.0,
        retry_after_cap: float = 60.0,
    ) -> None:
        self._concurrency = max(1, concurrency)
        self._max_attempts = max(1, max_attempts)
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._retry_after_cap = retry_after_cap
        self._auth_failed = False
        self._auth_reason = ""
        self._slots = Slots(self._concurrency)
        self._latency = metrics.LatencyTally()

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

    async def prepare(self) -> None:
        """Ready what a first send would wait for (:meth:`_ready`), ahead of the send time.
        A failure is left to the sends, which try again and report it."""
        try:
            await self._ready()
        except Exception as exc:  # refused credentials, an endpoint down: the sends tell
            log.debug("%s at %s not prepared: %r", type(self).__name__, self.endpoint, exc)

    async def _ready(self) -> None:
        """What :meth:`prepare` readies (a credential, a connection): nothing unless a
        provider says what."""
        return None

    async def send_many(
        self, messages: Sequence[PushMessage], *, on_result: OnResult | None = None
    ) -> list[PushResult]:
        """Send every message; one result per message, in order; never raises per message.

        ``on_result`` is awaited with each result as it arrives (a message that could
        not be built included), while the message still holds its slot.
        """
        results: list[PushResult | None] = [None] * len(messages)
        bodies: list[bytes | None] = [None] * len(messages)
        sendable = 0
        for index, message in enumerate(messages):
            try:
                bodies[index] = self._build(message)
                sendable += 1
            except PayloadError:
                unsendable = results[index] = PushResult(
                    message.key, FP_ERR_JSON_MARSHALLING, None, None
                )
                if on_result is not None:
                    await on_result(unsendable)
        try:
            if sendable:
                await self._send_all(messages, bodies, sendable, results, on_result)
        finally:
            self._latency.flush(metrics.provider_of(self.platform))
        return [result for result in results if result is not None]

    async def _send_all(
        self,
        messages: Sequence[PushMessage],
        bodies: Sequence[bytes | None],
        sendable: int,
        results: list[PushResult | None],
        on_result: OnResult | None,
    ) -> None:
        """Send each message that has a body (``sendable`` of them) into its place in
        ``results``, a slot held from its send until ``on_result`` has returned."""
        work = ((i, messages[i], body) for i, body in enumerate(bodies) if body is not None)
        slots = self._slots

        async def worker() -> None:
            for index, message, body in work:
                await slots.acquire()
                if freeze.FENCED:  # the process exits once the messages in flight are answered
                    await asyncio.Event().wait()
                try:
                    result = results[index] = await self._send_one(message, body)
                    if on_result is not None:
                        await on_result(result)
                finally:
                    slots.release()

        workers = [asyncio.create_task(worker()) for _ in range(min(self._concurrency, sendable))]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            # One failed (an answer that could not be recorded): the others stop now, their
            # slots given back, instead of sending on and then waiting for ever on a
            # recorder that is gone, holding slots the process's next chunks need.
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise

    def _failed(self, message: PushMessage, reason: str) -> PushResult:
        return PushResult(message.key, FP_ERR_PUSH_FAILED, None, None, reason)

    def _flag_auth(self, why: str) -> None:
        if not self._auth_failed:
            log.error(
                "%s provider at %s refused the app's credentials: %s",
                self.platform.value,
                self.endpoint,
                why,
            )
            self._auth_failed = True
            self._auth_reason = f"credentials refused: {why}"

    async def _send_one(
        self, message: PushMessage, body: bytes, first: Answer | Exception | None = None
    ) -> PushResult:
        """Send ``message`` until its outcome is final; ``first``: the outcome of a first
        try already made (its answer, or the exception it raised), judged before anything
        is sent."""
        tries = 0
        not_processed = 0
        refreshed = False
        while True:
            if self._auth_failed:
                return self._failed(message, self._auth_reason)
            retry_after: str | None = None
            try:
                if first is None:
                    started = time.perf_counter()
                    answer = await self._post(message, body)
                    self._latency.observe(time.perf_counter() - started)
                else:
                    outcome, first = first, None
                    if isinstance(outcome, Exception):
                        raise outcome
                    answer = outcome
            except NotProcessed as exc:
                not_processed += 1
                if not_processed <= 4 * self._max_attempts:
                    continue
                verdict = Verdict(FP_ERR_PUSH_FAILED, retry=True, reason=f"not processed: {exc}")
            except AuthRefused as exc:
                self._flag_auth(str(exc))
                return self._failed(message, self._auth_reason)
            except (TransportError, AuthUnavailable, TimeoutError) as exc:
                verdict = Verdict(FP_ERR_PUSH_FAILED, retry=True, reason=_describe(exc))
            else:
                verdict = self._map(answer)
                retry_after = answer.retry_after
                if verdict.refresh_auth:
                    if not refreshed:
                        refreshed = True
                        self._refresh(answer.credential)
                        continue
                    verdict = Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=verdict.reason)
                if verdict.error_message and not verdict.reason:
                    verdict = replace(verdict, reason=f"HTTP {answer.status}")
            if verdict.auth_failed:
                self._flag_auth(verdict.reason)
                return self._failed(message, self._auth_reason)
            if verdict.retry:
                tries += 1
                if tries >= self._max_attempts:
                    return self._failed(message, f"{verdict.reason} (after {tries} tries)")
                metrics.count_retry(self.platform)
                await asyncio.sleep(self._delay(tries, retry_after))
                continue
            return _result(message, verdict)

    def _final(self, message: PushMessage, answer: Answer) -> PushResult | None:
        """The result of a first try's ``answer`` when it is final at once: None when
        the answer asks for more (a retry, a new credential, flagging the app), which
        :meth:`_send_one` then does with ``first=answer``."""
        verdict = self._map(answer)
        if verdict.retry or verdict.refresh_auth or verdict.auth_failed:
            return None
        if verdict.error_message and not verdict.reason:
            verdict = replace(verdict, reason=f"HTTP {answer.status}")
        return _result(message, verdict)

    def _delay(self, tries: int, retry_after: str | None) -> float:
        asked = retry_after_seconds(retry_after)
        if asked is not None:
            return float(min(asked, self._retry_after_cap))
        backoff: float = min(self._backoff_cap, self._backoff_base * 2.0 ** (tries - 1))
        return backoff * _JITTER.uniform(0.5, 1.0)


def _result(message: PushMessage, verdict: Verdict) -> PushResult:
    """The result of a final ``verdict``: sent now, or refused."""
    if not verdict.error_message:
        return PushResult(message.key, "", datetime.now(UTC), None)
    return PushResult(
        message.key, verdict.error_message, None, verdict.unregistered_at, verdict.reason
    )


def _describe(exc: BaseException) -> str:
    """An exception as the operator needs it: its kind and its text."""
    text = str(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out{': ' + text if text else ''}"
    return text or type(exc).__name__
