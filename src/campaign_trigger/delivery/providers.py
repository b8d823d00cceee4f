"""The push provider of an app's platform, configured from settings, and a pool of them.

:func:`pooled_provider` keeps one provider per app (and event loop) open across the
chunks and runs of a process: connections, access tokens and the concurrency slots
are shared by everything that sends to that app from this process.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from campaign_trigger.config import Settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.base import PushProvider
from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.store.models import Platform

if TYPE_CHECKING:
    from campaign_trigger.services.audience import AppTarget


def open_provider(platform: Platform, *, settings: Settings) -> PushProvider:
    """FCM for Android, APNs for iOS; close it with ``await provider.aclose()``."""
    if platform == Platform.android:
        return FcmProvider(
            fcm_credentials(settings),
            concurrency=settings.delivery_concurrency,
            max_attempts=settings.delivery_max_attempts,
        )
    return ApnsProvider(
        apns_credentials(settings),
        concurrency=settings.delivery_concurrency,
        max_attempts=settings.delivery_max_attempts,
    )


# Keyed by event loop too: a provider's connections belong to one loop.
_PoolKey = tuple[int, str, str, str, str]
_pool: dict[_PoolKey, PushProvider] = {}


def _pool_key(settings: Settings, app: AppTarget) -> _PoolKey:
    loop = id(asyncio.get_running_loop())
    return (loop, app.platform.value, app.app_id, settings.fcm_base_url, settings.apns_base_url)


def pooled_provider(settings: Settings, app: AppTarget) -> PushProvider:
    """This process's provider for ``app`` (opened on first use)."""
    key = _pool_key(settings, app)
    for stale in [k for k in _pool if k[0] != key[0]]:  # a finished event loop's
        _pool.pop(stale, None)
    provider = _pool.get(key)
    if provider is None:
        provider = _pool[key] = open_provider(app.platform, settings=settings)
    return provider


async def release_provider(settings: Settings, app: AppTarget) -> None:
    """Close and forget ``app``'s provider (its credentials were refused)."""
    provider = _pool.pop(_pool_key(settings, app), None)
    if provider is not None:
        await provider.aclose()


async def close_providers() -> None:
    """Close this loop's pooled providers (at worker shutdown)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _pool if k[0] == loop]:
        await _pool.pop(key).aclose()
