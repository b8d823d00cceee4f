"""Delivery: push providers (FCM HTTP v1, APNs HTTP/2), the in-app inbox, the sandbox.

The flow calls :func:`open_provider` once per app and chunk (or per app and run), then
``await provider.send_many(messages)``; see ``delivery/base.py`` for the contract.
"""

from campaign_trigger.delivery.base import (
    FP_ERR_BAD_RECIPIENT_TOKEN,
    FP_ERR_JSON_MARSHALLING,
    FP_ERR_PUSH_FAILED,
    FP_ERR_TOKEN_UNREGISTERED,
    PushMessage,
    PushProvider,
    PushResult,
)
from campaign_trigger.delivery.providers import open_provider

__all__ = [
    "FP_ERR_BAD_RECIPIENT_TOKEN",
    "FP_ERR_JSON_MARSHALLING",
    "FP_ERR_PUSH_FAILED",
    "FP_ERR_TOKEN_UNREGISTERED",
    "PushMessage",
    "PushProvider",
    "PushResult",
    "open_provider",
]
