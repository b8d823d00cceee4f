"""Provider payloads built from a :class:`~campaign_trigger.delivery.base.PushMessage`.

Every field of a campaign maps to both providers as they document it (FCM HTTP v1
``projects.messages``; Apple's "Generating a remote notification" and "Sending
notification requests to APNs"):

- title, body: ``notification.title`` / ``.body``; ``aps.alert.title`` / ``.body``
- data: ``data`` (a string map); top-level keys beside ``aps``
- image: ``notification.image``; top-level ``image`` and ``aps.mutable-content: 1``
  (for the app's notification service extension, which loads it)
- sound: ``android.notification.sound``; ``aps.sound`` (``"default"`` when unset)
- badge: ``android.notification.notification_count``; ``aps.badge``
- priority high / normal: ``android.priority``; ``apns-priority`` 10 / 5
- ttl: ``android.ttl`` (``"<n>s"``); ``apns-expiration`` (now + ttl; 0 for a TTL of 0)
- interruption level: ``android.notification.notification_priority`` (passive: LOW,
  active: DEFAULT, time-sensitive: HIGH, critical: MAX); ``aps.interruption-level``
- thread id: none on Android; ``aps.thread-id``
- category: ``android.notification.click_action``; ``aps.category``
- silent: a data-only message (no ``notification``); ``aps.content-available: 1`` with
  ``apns-push-type: background`` and ``apns-priority: 5``

The size rule (DESIGN §5): the final payload — FCM's ``notification``, ``data`` and
``android`` fields, or APNs's whole JSON body — is at most
:data:`~campaign_trigger.delivery.base.MAX_PAYLOAD_BYTES` bytes of UTF-8. A payload
over it, or one that cannot be serialised (a non-string title, body or data value, a
lone surrogate, an ``aps`` data key), raises :class:`PayloadError` and is never sent;
the provider reports ``FPErrJSONMarshalling``.

Bodies are assembled from JSON-escaped strings rather than by ``json.dumps`` of a
whole document: this runs once per message at 10,000+ messages/s, and the fragments
that are the same for every message of a chunk (the options, a ``data`` block without
variables) are encoded once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES, PushMessage, PushOptions

_escape = json.encoder.encode_basestring  # C-accelerated; keeps non-ASCII characters as is

ANDROID_PRIORITY: Final = {
    "passive": "PRIORITY_LOW",
    "active": "PRIORITY_DEFAULT",
    "time-sensitive": "PRIORITY_HIGH",
    "critical": "PRIORITY_MAX",
}


class PayloadError(ValueError):
    """The message cannot become a valid provider payload."""


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise PayloadError("title, body, data keys and values must be strings")
    return _escape(value)


def _data_members(data: Mapping[str, str]) -> str:
    """``"k":"v","k2":"v2"`` (no braces), every key and value a string."""
    return ",".join(f"{_string(key)}:{_string(value)}" for key, value in data.items())


class _LastFragment:
    """A one-entry memo of the last ``data`` mapping's encoding (compared by value)."""

    __slots__ = ("entry",)

    def __init__(self) -> None:
        self.entry: tuple[dict[str, str], str] | None = None

    def members(self, data: Mapping[str, str]) -> str:
        entry = self.entry  # one read: safe if another thread swaps it
        if entry is not None and entry[0] == data:
            return entry[1]
        members = _data_members(data)
        self.entry = (dict(data), members)
        return members


_fcm_data = _LastFragment()
_apns_data = _LastFragment()


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError("payload cannot be serialised: not valid Unicode") from None


def _check_size(size: int) -> None:
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"payload is {size} bytes, over {MAX_PAYLOAD_BYTES}")


def _members(pairs: list[tuple[str, object]]) -> str:
    return ",".join(
        f"{_escape(name)}:{value if isinstance(value, int) else _string(value)}"
        for name, value in pairs
    )


@lru_cache(maxsize=256)
def _android_parts(options: PushOptions) -> tuple[str, str]:
    """The chunk's ``android`` members and ``android.notification`` members (no braces)."""
    android: list[tuple[str, object]] = [("priority", options.priority)]
    if options.ttl_seconds is not None:
        android.append(("ttl", f"{options.ttl_seconds}s"))
    notification: list[tuple[str, object]] = []
    if not options.silent:
        if options.sound is not None:
            notification.append(("sound", options.sound))
        if options.badge is not None:
            notification.append(("notification_count", options.badge))
        if options.category is not None:
            notification.append(("click_action", options.category))
        if options.interruption_level is not None:
            level = ANDROID_PRIORITY.get(options.interruption_level)
            if level is None:
                raise PayloadError(f"unknown interruption level {options.interruption_level!r}")
            notification.append(("notification_priority", level))
    return _members(android), _members(notification)


def _android(options: PushOptions, collapse_id: str) -> str:
    """The ``android`` member: the chunk's options plus the message's collapse identity.

    The identity goes in ``android.notification.tag``: a notification with the tag of
    one already shown replaces it on the device. Not in ``android.collapse_key``: FCM
    keeps at most four collapse keys per offline device and drops the others, and a
    key per message would lose transactional messages to a device that was offline.
    A data-only (silent) message shows nothing, so it has no notification to replace.
    """
    members, notification = _android_parts(options)
    if collapse_id and not options.silent:
        tag = f'"tag":{_string(collapse_id)}'
        notification = f"{notification},{tag}" if notification else tag
    if notification:
        return f'{{{members},"notification":{{{notification}}}}}'
    return f"{{{members}}}"


def fcm_body(message: PushMessage) -> bytes:
    """The JSON body of an FCM v1 ``messages:send`` call."""
    options = message.options
    parts: list[str] = []
    if not options.silent:
        image = f',"image":{_string(message.image)}' if message.image else ""
        parts.append(
            f'"notification":{{"title":{_string(message.title)},'
            f'"body":{_string(message.body)}{image}}}'
        )
    members = _fcm_data.members(message.data)
    if members:
        parts.append(f'"data":{{{members}}}')
    parts.append(f'"android":{_android(options, message.collapse_id)}')
    payload = _utf8("{" + ",".join(parts) + "}")
    _check_size(len(payload))
    head = _utf8(f'{{"message":{{"token":{_string(message.token)},')
    return head + payload[1:] + b"}"


@lru_cache(maxsize=256)
def _aps_tail(options: PushOptions) -> str:
    """The ``aps`` members after the alert that are the same for the whole chunk."""
    if options.silent:
        return ""
    aps: list[tuple[str, object]] = [("sound", options.sound or "default")]
    if options.badge is not None:
        aps.append(("badge", options.badge))
    if options.thread_id is not None:
        aps.append(("thread-id", options.thread_id))
    if options.category is not None:
        aps.append(("category", options.category))
    if options.interruption_level is not None:
        aps.append(("interruption-level", options.interruption_level))
    return "," + _members(aps)


def apns_body(message: PushMessage) -> bytes:
    """The JSON body of an APNs ``/3/device/{token}`` call: ``aps`` plus the data keys."""
    if "aps" in message.data:
        raise PayloadError("'aps' is reserved in APNs payloads")
    options = message.options
    if options.silent:
        aps = '{"content-available":1}'
    else:
        alert = f'{{"title":{_string(message.title)},"body":{_string(message.body)}}}'
        mutable = ',"mutable-content":1' if message.image else ""
        aps = f'{{"alert":{alert}{_aps_tail(options)}{mutable}}}'
    members = _apns_data.members(message.data)
    extra = f",{members}" if members else ""
    if message.image:
        if "image" in message.data:
            raise PayloadError("'image' is the image URL's key in APNs payloads")
        extra = f',"image":{_string(message.image)}{extra}'
    body = _utf8(f'{{"aps":{aps}{extra}}}')
    _check_size(len(body))
    return body
