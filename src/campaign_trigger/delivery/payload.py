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
- the message's identity (its collapse id): ``data.message_id`` and top-level
  ``message_id``, on every push; also ``android.notification.tag`` and
  ``apns-collapse-id``, which replace a notification shown twice but cannot stop a
  silent push from reaching the app twice (a retry after a timeout, DESIGN §5): the app
  drops a ``message_id`` it has seen

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
from dataclasses import dataclass
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
MESSAGE_ID_KEY: Final = "message_id"


def _with_message_id(members: str, message: PushMessage) -> str:
    """The data members and the message's identity (none if the data has its own: a
    campaign made before the key was reserved)."""
    if not message.collapse_id or MESSAGE_ID_KEY in message.data:
        return members
    own = f'"{MESSAGE_ID_KEY}":{_string(message.collapse_id)}'
    return f"{members},{own}" if members else own


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


@dataclass(frozen=True, slots=True)
class _Shape:
    """The fragments of a chunk's payloads that depend on its options only."""

    android_members: str  # "priority":...,"ttl":... (no braces)
    notification_members: str  # android.notification's fixed members (no braces)
    aps_tail: str  # ,"sound":...,"badge":... after the alert ("" for a silent push)


def _shape_of(options: PushOptions) -> _Shape:
    android: list[tuple[str, object]] = [("priority", options.priority)]
    if options.ttl_seconds is not None:
        android.append(("ttl", f"{options.ttl_seconds}s"))
    notification: list[tuple[str, object]] = []
    aps: list[tuple[str, object]] = []
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
        aps.append(("sound", options.sound or "default"))
        if options.badge is not None:
            aps.append(("badge", options.badge))
        if options.thread_id is not None:
            aps.append(("thread-id", options.thread_id))
        if options.category is not None:
            aps.append(("category", options.category))
        if options.interruption_level is not None:
            aps.append(("interruption-level", options.interruption_level))
    return _Shape(_members(android), _members(notification), "," + _members(aps) if aps else "")


_last_shape: tuple[PushOptions, _Shape] | None = None


def _shape(options: PushOptions) -> _Shape:
    """The options' fragments; a chunk's messages share one options object, so the
    last one is remembered by identity (no hashing per message)."""
    global _last_shape
    last = _last_shape  # one read: safe if another thread swaps it
    if last is not None and last[0] is options:
        return last[1]
    shape = _cached_shape(options)
    _last_shape = (options, shape)
    return shape


@lru_cache(maxsize=256)
def _cached_shape(options: PushOptions) -> _Shape:
    return _shape_of(options)


def _android(shape: _Shape, silent: bool, collapse_id: str) -> str:
    """The ``android`` member: the chunk's options plus the message's collapse identity.

    The identity goes in ``android.notification.tag``: a notification with the tag of
    one already shown replaces it on the device. Not in ``android.collapse_key``: FCM
    keeps at most four collapse keys per offline device and drops the others, and a
    key per message would lose transactional messages to a device that was offline.
    A data-only (silent) message shows nothing, so it has no notification to replace.
    """
    notification = shape.notification_members
    if collapse_id and not silent:
        tag = f'"tag":{_string(collapse_id)}'
        notification = f"{notification},{tag}" if notification else tag
    if notification:
        return f'{{{shape.android_members},"notification":{{{notification}}}}}'
    return f"{{{shape.android_members}}}"


def fcm_body(message: PushMessage) -> bytes:
    """The JSON body of an FCM v1 ``messages:send`` call."""
    payload = fcm_payload(message)
    head = _utf8(f'{{"message":{{"token":{_string(message.token)},')
    return head + payload[1:] + b"}"


def fcm_payload(message: PushMessage) -> bytes:
    """The FCM message's ``notification``, ``data`` and ``android`` members as one JSON
    object: what the size rule measures (the body adds the token around it)."""
    options = message.options
    members = _with_message_id(_fcm_data.members(message.data), message)
    data = f',"data":{{{members}}}' if members else ""
    android = _android(_shape(options), options.silent, message.collapse_id)
    if options.silent:
        payload = _utf8(
            f'{{{data[1:]},"android":{android}}}' if data else f'{{"android":{android}}}'
        )
    else:
        image = f',"image":{_string(message.image)}' if message.image else ""
        payload = _utf8(
            f'{{"notification":{{"title":{_string(message.title)},'
            f'"body":{_string(message.body)}{image}}}{data},"android":{android}}}'
        )
    _check_size(len(payload))
    return payload


def apns_body(message: PushMessage) -> bytes:
    """The JSON body of an APNs ``/3/device/{token}`` call: ``aps`` plus the data keys."""
    data = message.data
    if "aps" in data:
        raise PayloadError("'aps' is reserved in APNs payloads")
    members = _with_message_id(_apns_data.members(data), message)
    extra = f",{members}" if members else ""
    image = message.image
    if image:
        if "image" in data:
            raise PayloadError("'image' is the image URL's key in APNs payloads")
        extra = f',"image":{_string(image)}{extra}'
    options = message.options
    if options.silent:
        body = _utf8(f'{{"aps":{{"content-available":1}}{extra}}}')
    else:
        last = _last_shape
        tail = (last[1] if last is not None and last[0] is options else _shape(options)).aps_tail
        mutable = ',"mutable-content":1' if image else ""
        body = _utf8(
            f'{{"aps":{{"alert":{{"title":{_string(message.title)},'
            f'"body":{_string(message.body)}}}{tail}{mutable}}}{extra}}}'
        )
    _check_size(len(body))
    return body
