"""The delivery contract: what a flow hands a push provider and what it gets back.

A flow opens one provider per app (:func:`campaign_trigger.delivery.providers.open_provider`),
calls :meth:`PushProvider.send_many` with a chunk of rendered messages and gets one
:class:`PushResult` per message, in the same order, never an exception for a
per-message failure. ``error_message`` is ``""`` on success, else one of the
``FPErr*`` values of the report (DESIGN §5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, Protocol

from campaign_trigger.store.models import Platform

FP_ERR_TOKEN_UNREGISTERED: Final = "FPErrTokenUnregistered"  # noqa: S105
FP_ERR_BAD_RECIPIENT_TOKEN: Final = "FPErrBadRecipientToken"  # noqa: S105
FP_ERR_JSON_MARSHALLING: Final = "FPErrJSONMarshalling"
FP_ERR_PUSH_FAILED: Final = "FPErrPushFailed"

MAX_PAYLOAD_BYTES: Final = 4096
"""Largest rendered payload we send (FCM and APNs both allow 4 KB)."""


@dataclass(frozen=True, slots=True)
class PushOptions:
    """How a campaign's pushes are delivered: the same for every message of a chunk.

    Each maps to both providers as they document it (``delivery/payload.py``; the table
    is in docs/apps-and-credentials.md). ``None``: the provider's default.
    """

    priority: Literal["high", "normal"] = "high"
    ttl_seconds: int | None = None  # FCM android.ttl; APNs apns-expiration (None: 24 h)
    sound: str | None = None  # None: the default sound
    badge: int | None = None
    interruption_level: str | None = None  # passive, active, time-sensitive, critical
    thread_id: str | None = None
    category: str | None = None
    silent: bool = False  # APNs background push; FCM data-only message


DEFAULT_OPTIONS: Final = PushOptions()


@dataclass(frozen=True, slots=True)
class PushMessage:
    """One rendered push message for one device token.

    ``collapse_id`` is the message's identity on the device (at most 64 ASCII
    characters): a second send of the same message after a crash replaces the first
    notification instead of adding one (APNs ``apns-collapse-id``; FCM
    ``android.notification.tag``). Empty: none.
    """

    key: int  # the caller's index, echoed back in the result
    token: str
    title: str
    body: str
    data: Mapping[str, str]  # request_id, campaign_id and the campaign's rendered data
    collapse_id: str = ""
    image: str = ""  # the rendered image URL ("" = none)
    options: PushOptions = DEFAULT_OPTIONS


@dataclass(frozen=True, slots=True)
class PushResult:
    """What happened to one :class:`PushMessage`."""

    key: int
    error_message: str  # "" on success, else one of the FPErr* values
    sent_at: datetime | None  # UTC, when the provider accepted it
    unregistered_at: datetime | None  # set when the token came back unregistered
    reason: str = ""  # why it failed, for the operator's logs (never in a report)


class PushProvider(Protocol):
    """A push service client for one app (FCM for Android, APNs for iOS)."""

    platform: Platform
    endpoint: str  # the provider's base URL, named in the logs of failed sends

    async def send_many(
        self,
        messages: Sequence[PushMessage],
        *,
        on_result: Callable[[PushResult], Awaitable[None]] | None = None,
    ) -> list[PushResult]:
        """Send every message with bounded concurrency and retries; one result each, in
        order. ``on_result`` is awaited with each result as it arrives, before the
        message's concurrency slot is given back."""
        ...

    async def prepare(self) -> None:
        """Ready what a first send would wait for (a credential, a connection), ahead of
        the send time; never raises: a failure is left to the sends, which report it."""
        ...

    @property
    def auth_failed(self) -> bool:
        """True once the provider refused our credentials (the app is flagged)."""
        ...

    async def aclose(self) -> None:
        """Close connections."""
        ...
