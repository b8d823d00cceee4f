"""Provider answers → report outcomes (DESIGN §5), as pure functions of status and body.

Each function returns a :class:`Verdict`: the report's ``error_message`` when the
answer is final, or what the client must do next (retry later, refresh its
credentials and retry once). Unknown answers fail closed: ``FPErrPushFailed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

from campaign_trigger.delivery.base import (
    FP_ERR_BAD_RECIPIENT_TOKEN,
    FP_ERR_JSON_MARSHALLING,
    FP_ERR_PUSH_FAILED,
    FP_ERR_TOKEN_UNREGISTERED,
)

FCM_ERROR_TYPE: Final = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_TYPE: Final = "type.googleapis.com/google.rpc.BadRequest"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one provider answer means."""

    error_message: str = ""  # the report's value when final ("" = delivered)
    retry: bool = False  # transient: retry with backoff (Retry-After wins)
    refresh_auth: bool = False  # our credential expired: refresh it, retry once
    auth_failed: bool = False  # the provider refused our credentials: flag the app
    unregistered_at: datetime | None = None  # the token is gone for good
    reason: str = ""  # the provider's code, for logs


OK: Final = Verdict()
PUSH_FAILED: Final = Verdict(FP_ERR_PUSH_FAILED)
TRANSIENT: Final = Verdict(FP_ERR_PUSH_FAILED, retry=True)


def _json(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return document if isinstance(document, dict) else {}


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _transient_status(status: int) -> bool:
    return status == 429 or status >= 500


def map_fcm(status: int, body: bytes) -> Verdict:
    """Map an FCM HTTP v1 answer, telling a bad token from a bad payload by its details."""
    if status == 200:
        return OK
    error = _json(body).get("error")
    error = error if isinstance(error, dict) else {}
    code = str(error.get("status", ""))
    message = str(error.get("message", ""))
    fcm_code = ""
    violations: list[str] = []
    for detail in error.get("details") or ():
        if not isinstance(detail, dict):
            continue
        if detail.get("@type") == FCM_ERROR_TYPE:
            fcm_code = str(detail.get("errorCode", ""))
        elif detail.get("@type") == BAD_REQUEST_TYPE:
            violations += [
                str(v.get("field", ""))
                for v in detail.get("fieldViolations") or ()
                if isinstance(v, dict)
            ]
    reason = fcm_code or code or str(status)
    if fcm_code in ("UNREGISTERED", "SENDER_ID_MISMATCH"):
        return Verdict(FP_ERR_TOKEN_UNREGISTERED, unregistered_at=datetime.now(UTC), reason=reason)
    if fcm_code == "THIRD_PARTY_AUTH_ERROR":
        return Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=reason)
    if fcm_code in ("QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL") or _transient_status(status):
        return Verdict(FP_ERR_PUSH_FAILED, retry=True, reason=reason)
    if fcm_code == "INVALID_ARGUMENT" or code == "INVALID_ARGUMENT" or status == 400:
        if violations:
            about_token = any(field.endswith("token") for field in violations)
        elif fcm_code == "INVALID_ARGUMENT":
            about_token = True  # FcmError without a field violation: the registration token
        else:
            about_token = "token" in message.lower()
        outcome = FP_ERR_BAD_RECIPIENT_TOKEN if about_token else FP_ERR_JSON_MARSHALLING
        return Verdict(outcome, reason=reason)
    if status == 401:
        return Verdict(FP_ERR_PUSH_FAILED, refresh_auth=True, reason=reason)
    if status in (403, 404):  # PERMISSION_DENIED, unknown project: our configuration
        return Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=reason)
    return Verdict(FP_ERR_PUSH_FAILED, reason=reason)


_APNS_UNREGISTERED: Final = frozenset({"Unregistered", "DeviceTokenNotForTopic"})
_APNS_BAD_TOKEN: Final = frozenset({"BadDeviceToken", "ExpiredToken", "MissingDeviceToken"})
_APNS_BAD_PAYLOAD: Final = frozenset(
    {
        "PayloadTooLarge",
        "PayloadEmpty",
        "BadMessageId",
        "BadCollapseId",
        "BadExpirationDate",
        "BadPriority",
        "InvalidPushType",
        "DuplicateHeaders",
        "BadPath",
        "MethodNotAllowed",
    }
)
_APNS_AUTH: Final = frozenset(
    {
        "BadCertificate",
        "BadCertificateEnvironment",
        "Forbidden",
        "InvalidProviderToken",
        "MissingProviderToken",
        "UnrelatedKeyIdInToken",
        "BadEnvironmentKeyIdInToken",
        "BadTopic",
        "MissingTopic",
        "TopicDisallowed",
    }
)
_APNS_TRANSIENT: Final = frozenset(
    {
        "TooManyRequests",
        "TooManyProviderTokenUpdates",
        "InternalServerError",
        "ServiceUnavailable",
        "Shutdown",
        "IdleTimeout",
    }
)


def _apns_timestamp(document: dict[str, Any]) -> datetime:
    stamp = document.get("timestamp")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        try:
            return datetime.fromtimestamp(stamp / 1000, UTC)
        except (OverflowError, OSError, ValueError):
            pass
    return datetime.now(UTC)


def map_apns(status: int, body: bytes) -> Verdict:
    """Map an APNs answer by its ``reason`` string (the status only when the reason is unknown)."""
    if status == 200:
        return OK
    document = _json(body)
    reason = str(document.get("reason", ""))
    if reason in _APNS_UNREGISTERED:
        when = _apns_timestamp(document)
        return Verdict(FP_ERR_TOKEN_UNREGISTERED, unregistered_at=when, reason=reason)
    if reason in _APNS_BAD_TOKEN:
        return Verdict(FP_ERR_BAD_RECIPIENT_TOKEN, reason=reason)
    if reason in _APNS_BAD_PAYLOAD:
        return Verdict(FP_ERR_JSON_MARSHALLING, reason=reason)
    if reason == "ExpiredProviderToken":
        return Verdict(FP_ERR_PUSH_FAILED, refresh_auth=True, reason=reason)
    if reason in _APNS_AUTH:
        return Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=reason)
    if reason in _APNS_TRANSIENT or _transient_status(status):
        return Verdict(FP_ERR_PUSH_FAILED, retry=True, reason=reason or str(status))
    reason = reason or str(status)
    if status == 410:
        return Verdict(
            FP_ERR_TOKEN_UNREGISTERED, unregistered_at=_apns_timestamp(document), reason=reason
        )
    if status == 403:
        return Verdict(FP_ERR_PUSH_FAILED, auth_failed=True, reason=reason)
    if status == 413:
        return Verdict(FP_ERR_JSON_MARSHALLING, reason=reason)
    return Verdict(FP_ERR_PUSH_FAILED, reason=reason)
