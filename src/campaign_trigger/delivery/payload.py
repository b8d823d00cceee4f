"""Provider payloads built from a :class:`~campaign_trigger.delivery.base.PushMessage`.

The size rule (DESIGN §5): the rendered payload — FCM's ``notification``, ``data`` and
``android`` fields, or APNs's whole JSON body — is at most
:data:`~campaign_trigger.delivery.base.MAX_PAYLOAD_BYTES` bytes of UTF-8. A payload
over it, or one that cannot be serialised (a non-string title, body or data value, a
lone surrogate, an ``aps`` data key), raises :class:`PayloadError` and is never sent;
the provider reports ``FPErrJSONMarshalling``.

Bodies are assembled from JSON-escaped strings rather than by ``json.dumps`` of a
whole document: this runs once per message at 10,000+ messages/s, and the ``data``
and ``android`` fragments, the same for every message of a chunk, are encoded once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES, PushMessage

_escape = json.encoder.encode_basestring  # C-accelerated; keeps non-ASCII characters as is
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

_DEFAULT_ANDROID: Mapping[str, Any] = {"priority": "high"}


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
_last_android: tuple[dict[str, Any], str] | None = None


def _android_options(android: Mapping[str, Any]) -> str:
    global _last_android
    entry = _last_android
    if entry is not None and entry[0] == android:
        return entry[1]
    try:
        encoded = _compact(dict(android))
    except (TypeError, ValueError):
        raise PayloadError("android options cannot be serialised") from None
    _last_android = (dict(android), encoded)
    return encoded


_apns_data = _LastFragment()


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError("payload cannot be serialised: not valid Unicode") from None


def _check_size(size: int) -> None:
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"payload is {size} bytes, over {MAX_PAYLOAD_BYTES}")


def _android(options: str, collapse_id: str) -> str:
    """The ``android`` member: the chunk's options plus the message's collapse identity.

    The identity goes in ``android.notification.tag``: a notification with the tag of
    one already shown replaces it on the device. Not in ``android.collapse_key``: FCM
    keeps at most four collapse keys per offline device and drops the others, and a
    key per message would lose transactional messages to a device that was offline.
    """
    if not collapse_id:
        return options
    if '"notification"' in options:
        raise PayloadError("android options may not set notification")
    extra = f'"notification":{{"tag":{_string(collapse_id)}}}'
    return f"{{{extra}}}" if options == "{}" else f"{options[:-1]},{extra}}}"


def fcm_body(message: PushMessage, *, android: Mapping[str, Any] | None = None) -> bytes:
    """The JSON body of an FCM v1 ``messages:send`` call."""
    notification = (
        f'{{"notification":{{"title":{_string(message.title)},"body":{_string(message.body)}}}'
    )
    members = _fcm_data.members(message.data)
    data = f',"data":{{{members}}}' if members else ""
    options = _android_options(android if android is not None else _DEFAULT_ANDROID)
    android_member = _android(options, message.collapse_id)
    payload = _utf8(f'{notification}{data},"android":{android_member}}}')
    _check_size(len(payload))
    head = _utf8(f'{{"message":{{"token":{_string(message.token)},')
    return head + payload[1:] + b"}"


def apns_body(message: PushMessage) -> bytes:
    """The JSON body of an APNs ``/3/device/{token}`` call: ``aps`` plus the data keys."""
    if "aps" in message.data:
        raise PayloadError("'aps' is reserved in APNs payloads")
    alert = f'{{"title":{_string(message.title)},"body":{_string(message.body)}}}'
    members = _apns_data.members(message.data)
    extra = f",{members}" if members else ""
    body = _utf8(f'{{"aps":{{"alert":{alert},"sound":"default"}}{extra}}}')
    _check_size(len(body))
    return body
