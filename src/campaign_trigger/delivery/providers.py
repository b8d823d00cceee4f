"""The push provider of an app's platform, configured from its credentials, and a pool.

:func:`pooled_provider` keeps one provider per app (and event loop) open across the
chunks and runs of a process: connections, access tokens and the concurrency slots
are shared by everything that sends to that app from this process. The pool is keyed
by the credentials' identity too (``app:<id>:v<version>``, or ``global``): when an
app's credentials change, the next chunk gets a new provider, and the old one is
closed once the chunks still using it are done (:func:`provider_lease`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from campaign_trigger.config import Settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.base import PushProvider
from campaign_trigger.delivery.credentials import (
    ApnsCredentials,
    FcmCredentials,
    apns_credentials,
    fcm_credentials,
)
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.store.models import Platform

if TYPE_CHECKING:
    from campaign_trigger.services.audience import AppTarget

Credentials = FcmCredentials | ApnsCredentials


def open_provider(
    platform: Platform, *, settings: Settings, credentials: Credentials | None = None
) -> PushProvider:
    """FCM for Android, APNs for iOS, with ``credentials`` (default: the global ones);
    close it with ``await provider.aclose()``."""
    if platform == Platform.android:
        fcm = credentials if isinstance(credentials, FcmCredentials) else None
        return FcmProvider(
            fcm or fcm_credentials(settings),
            concurrency=settings.delivery_concurrency,
            max_attempts=settings.delivery_max_attempts,
        )
    apns = credentials if isinstance(credentials, ApnsCredentials) else None
    return ApnsProvider(
        apns or apns_credentials(settings),
        concurrency=settings.delivery_concurrency,
        max_attempts=settings.delivery_max_attempts,
    )


@dataclass(slots=True)
class _Pooled:
    provider: PushProvider
    identity: str
    users: int = 0
    retired: bool = False


# Keyed by event loop too: a provider's connections belong to one loop.
_PoolKey = tuple[int, str, str, str, str]
_pool: dict[_PoolKey, _Pooled] = {}


def _pool_key(settings: Settings, app: AppTarget) -> _PoolKey:
    loop = id(asyncio.get_running_loop())
    return (loop, app.platform.value, app.app_id, settings.fcm_base_url, settings.apns_base_url)


def _global(settings: Settings, platform: Platform) -> Credentials:
    return fcm_credentials(settings) if platform == Platform.android else apns_credentials(settings)


def pooled_provider(
    settings: Settings, app: AppTarget, credentials: Credentials | None = None
) -> PushProvider:
    """This process's provider for ``app`` with ``credentials`` (opened on first use).

    A pooled provider of other credentials is dropped from the pool (and closed when
    its last lease ends, see :func:`provider_lease`).
    """
    key = _pool_key(settings, app)
    for stale in [k for k in _pool if k[0] != key[0]]:  # a finished event loop's
        _pool.pop(stale, None)
    wanted = credentials or _global(settings, app.platform)
    entry = _pool.get(key)
    if entry is not None and entry.identity != wanted.identity:
        entry.retired = True
        _pool.pop(key)
        if entry.users == 0:
            _close_later(entry.provider)
        entry = None
    if entry is None:
        provider = open_provider(app.platform, settings=settings, credentials=wanted)
        entry = _pool[key] = _Pooled(provider, wanted.identity)
    return entry.provider


def _close_later(provider: PushProvider) -> None:
    task = asyncio.get_running_loop().create_task(provider.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()

ProviderFor = Callable[[Settings, "AppTarget", Credentials | None], PushProvider]


@contextlib.asynccontextmanager
async def provider_lease(
    settings: Settings,
    app: AppTarget,
    credentials: Credentials | None,
    provider_for: ProviderFor = pooled_provider,
) -> AsyncIterator[PushProvider]:
    """A provider for one chunk's sends to ``app``; a retired one is closed after its
    last lease."""
    provider = provider_for(settings, app, credentials)
    entry = next((e for e in _pool.values() if e.provider is provider), None)
    if entry is not None:
        entry.users += 1
    try:
        yield provider
    finally:
        if entry is not None:
            entry.users -= 1
            if entry.retired and entry.users == 0:
                await entry.provider.aclose()


async def release_provider(settings: Settings, app: AppTarget) -> None:
    """Forget ``app``'s provider (its credentials were refused); it is closed now, or
    when its last lease ends."""
    entry = _pool.pop(_pool_key(settings, app), None)
    if entry is not None:
        entry.retired = True
        if entry.users == 0:
            await entry.provider.aclose()


async def close_providers() -> None:
    """Close this loop's pooled providers (at worker shutdown)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _pool if k[0] == loop]:
        await _pool.pop(key).provider.aclose()
