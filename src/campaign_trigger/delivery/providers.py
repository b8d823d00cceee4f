"""Open the push provider of an app's platform, configured from settings."""

from __future__ import annotations

from campaign_trigger.config import Settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.base import PushProvider
from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.delivery.registry import DatabaseEvents
from campaign_trigger.delivery.sending import ProviderEvents
from campaign_trigger.store.models import Platform


def open_provider(
    platform: Platform,
    *,
    settings: Settings,
    app_id: str,
    events: ProviderEvents | None = None,
) -> PushProvider:
    """FCM for Android, APNs for iOS; close it with ``await provider.aclose()``.

    Unregistered tokens are recorded on the app's devices and refused credentials flag
    the app (``App.provider_auth_failed_at``) through ``events``, by default in the
    configured database.
    """
    sink = events or DatabaseEvents(app_id=app_id, database_url=settings.database_url)
    if platform == Platform.android:
        return FcmProvider(
            fcm_credentials(settings),
            concurrency=settings.delivery_concurrency,
            max_attempts=settings.delivery_max_attempts,
            events=sink,
        )
    return ApnsProvider(
        apns_credentials(settings),
        concurrency=settings.delivery_concurrency,
        max_attempts=settings.delivery_max_attempts,
        events=sink,
    )
