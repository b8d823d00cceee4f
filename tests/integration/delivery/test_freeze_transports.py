"""A send frozen after it started, before its bytes went out, is stopped by the freeze
watch as the transport is about to write (``delivery/freeze.py``): a send awaits a token,
a new connection or libcurl's next turn after it began, and a worker frozen long enough
there to lose its run must not write once it thaws. Counted at the real sandbox."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

import httpx
import pycurl
import pytest
from push_helpers import FakeClock, message

from campaign_trigger.config import Settings
from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials
from campaign_trigger.delivery.curl_h2 import http2_supported
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.delivery.sending import RetryingSender


class Frozen(Exception):
    """Raised by the watch's ``on_frozen`` in place of the process's exit."""


@contextlib.contextmanager
def watched() -> Iterator[tuple[FakeClock, list[float]]]:
    """A running watch on a clock the test moves; what it found, in place of an exit."""
    clock, found = FakeClock(), []

    def on_frozen(seconds: float) -> None:
        found.append(seconds)
        raise Frozen(seconds)

    with freeze.FreezeWatch(5.0, busy=lambda: False, on_frozen=on_frozen, clock=clock).watching():
        yield clock, found


def frozen_once_done(clock: FakeClock, step: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """``step`` with the process frozen for 30 s while it was awaited."""

    async def frozen_in(*args: Any) -> Any:
        try:
            return await step(*args)
        finally:
            clock.now += 30

    return frozen_in


def frozen_once_called(clock: FakeClock, step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` with the process frozen for 30 s as it is called."""

    def frozen_at(*args: Any) -> Any:
        clock.now += 30
        return step(*args)

    return frozen_at


async def stopped(provider: RetryingSender, sandbox: str, found: list[float]) -> None:
    """The send is stopped before a byte of the message goes out: the watch found the
    freeze and the sandbox received nothing."""
    sending: Awaitable[Any] = asyncio.ensure_future(provider.send_many([message(1, "ok-1")]))
    try:
        with contextlib.suppress(Frozen, TimeoutError):
            await asyncio.wait_for(sending, 1.0)
    finally:
        await provider.aclose()
    # found (a worker exits there; here each later check finds the same freeze again)
    assert found
    assert all(seconds == pytest.approx(30, abs=1) for seconds in found), found[:3]
    assert httpx.get(f"{sandbox}/sandbox/deliveries").json() == []


async def test_a_send_frozen_while_it_fetches_its_token_does_not_write(
    settings: Settings, sandbox: str
) -> None:
    with watched() as (clock, found):
        provider = FcmProvider(fcm_credentials(settings), max_attempts=1)
        provider.tokens.get = frozen_once_done(clock, provider.tokens.get)  # type: ignore[method-assign]
        await stopped(provider, sandbox, found)


async def test_a_send_frozen_while_it_connects_does_not_write(
    settings: Settings, sandbox: str
) -> None:
    with watched() as (clock, found):
        provider = FcmProvider(fcm_credentials(settings), max_attempts=1)
        await provider.tokens.get()  # the token at hand: the send's one wait is its connection
        provider.pool._connect = frozen_once_done(clock, provider.pool._connect)  # type: ignore[method-assign]
        await stopped(provider, sandbox, found)


@pytest.mark.parametrize("http2", ["curl", "h2"])
async def test_an_apns_send_frozen_after_it_was_handed_to_its_pool_does_not_write(
    settings: Settings, sandbox: str, http2: Literal["curl", "h2"]
) -> None:
    if http2 == "curl" and not http2_supported():
        pytest.skip("this libcurl has no HTTP/2")
    with watched() as (clock, found):
        provider = ApnsProvider(apns_credentials(settings), max_attempts=1, http2=http2)
        pool: Any = provider.pool
        if http2 == "curl":
            pool.start = frozen_once_called(clock, pool.start)
        else:
            pool.request = frozen_once_called(clock, pool.request)
        await stopped(provider, sandbox, found)


class _FrozenInTurn:
    """libcurl's multi handle, with the process frozen for 30 s as libcurl's first turn
    on a connection begins: after the pool checked for a freeze, before libcurl writes
    the request (the turns before it, on its timer, only connect)."""

    def __init__(self, multi: Any, clock: FakeClock) -> None:
        self._multi, self._clock, self._frozen = multi, clock, False

    def socket_action(self, fd: int, events: int) -> Any:
        if not self._frozen and fd != pycurl.SOCKET_TIMEOUT:
            self._frozen = True
            self._clock.now += 30
        return self._multi.socket_action(fd, events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._multi, name)


async def test_an_apns_send_frozen_within_libcurls_turn_does_not_write(
    settings: Settings, sandbox: str
) -> None:
    """libcurl writes many streams in one turn, in C: a freeze in the middle of it must
    not let the streams it had not written yet out (each body is read through a check)."""
    if not http2_supported():
        pytest.skip("this libcurl has no HTTP/2")
    with watched() as (clock, found):
        provider = ApnsProvider(apns_credentials(settings), max_attempts=1)
        pool: Any = provider.pool
        pool._multi = _FrozenInTurn(pool._multi, clock)
        await stopped(provider, sandbox, found)
