"""Provider payloads built from a :class:`~campaign_trigger.delivery.base.PushMessage`.

The size rule (DESIGN §5): the rendered payload — FCM's ``notification``, ``data`` and
``android`` fields, or APNs's whole JSON body — is at most
:data:`~campaign_trigger.delivery.base.MAX_PAYLOAD_BYTES` bytes of UTF-8. A payload
over it, or one that cannot be serialised (a non-string data value, a lone
surrogate, an ``aps`` data key), raises :class:`PayloadError` and is never sent;
the provider reports ``FPErrJSONMarshalling``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES, PushMessage

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class PayloadError(ValueError):
    """The message cannot become a valid provider payload."""


def _encode(document: Mapping[str, Any]) -> bytes:
    try:
        raw = _dumps(document).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise PayloadError(f"payload cannot be serialised: {type(exc).__name__}") from None
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"payload is {len(raw)} bytes, over {MAX_PAYLOAD_BYTES}")
    return raw


def _check_data(data: Mapping[str, str]) -> dict[str, str]:
    checked: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PayloadError("data keys and values must be strings")
        checked[key] = value
    return checked


def fcm_body(message: PushMessage, *, android: Mapping[str, Any] | None = None) -> bytes:
    """The JSON body of an FCM v1 ``messages:send`` call."""
    if not isinstance(message.title, str) or not isinstance(message.body, str):
        raise PayloadError("title and body must be strings")
    payload: dict[str, Any] = {"notification": {"title": message.title, "body": message.body}}
    data = _check_data(message.data)
    if data:
        payload["data"] = data
    payload["android"] = dict(android) if android is not None else {"priority": "high"}
    raw = _encode(payload)
    token = _encode({"token": message.token})
    # {"message":{"token":"...", <payload fields>}} without re-encoding the payload
    return b'{"message":' + token[:-1] + b"," + raw[1:] + b"}"


def apns_body(message: PushMessage) -> bytes:
    """The JSON body of an APNs ``/3/device/{token}`` call: ``aps`` plus the data keys."""
    if not isinstance(message.title, str) or not isinstance(message.body, str):
        raise PayloadError("title and body must be strings")
    data = _check_data(message.data)
    if "aps" in data:
        raise PayloadError("'aps' is reserved in APNs payloads")
    document: dict[str, Any] = {
        "aps": {"alert": {"title": message.title, "body": message.body}, "sound": "default"}
    }
    document.update(data)
    return _encode(document)
