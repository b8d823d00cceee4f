"""The sandbox's rule: the device token decides the outcome (DESIGN §5).

The token's prefix (FCM answer / APNs answer):

* ``unregistered-``: 404 UNREGISTERED / 410 Unregistered with a timestamp
* ``mismatch-``: 403 SENDER_ID_MISMATCH / 400 DeviceTokenNotForTopic
* ``expired-``: 400 INVALID_ARGUMENT about the token / 410 ExpiredToken
* ``invalid-``: 400 INVALID_ARGUMENT about the token / 400 BadDeviceToken
* ``fail-``: 500 INTERNAL / 500 InternalServerError, always
* ``flaky-``: 503 UNAVAILABLE / 503 ServiceUnavailable with Retry-After, once; then 200
* ``throttled-``: 429 QUOTA_EXCEEDED / 429 TooManyRequests with Retry-After, once; then 200
* ``expiredprovidertoken-``: 200 / 403 ExpiredProviderToken for the first JWT seen, then 200
* anything else: 200

"Once" is per token and message (FCM: the request body; APNs: its ``apns-id``).
Bodies copy the providers' documented ones (``tests/fixtures/providers``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from campaign_trigger.delivery.mapping import BAD_REQUEST_TYPE, FCM_ERROR_TYPE
from campaign_trigger.delivery.sandbox_state import SandboxState

__all__ = ["SandboxState", "apns_outcome", "fcm_outcome", "wait_until_listening"]

RETRY_AFTER_SECONDS: Final = 1

Body = dict[str, Any]
Outcome = tuple[int, Body, tuple[tuple[bytes, bytes], ...]]


def google_error(code: int, status: str, message: str, details: list[Body] | None = None) -> Body:
    """A google.rpc.Status error body."""
    error: Body = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return {"error": error}


def fcm_error(code: int, status: str, message: str, error_code: str) -> Body:
    """A google.rpc.Status body with an FcmError detail."""
    return google_error(code, status, message, [{"@type": FCM_ERROR_TYPE, "errorCode": error_code}])


def bad_request(problems: list[tuple[str, str | None]]) -> Body:
    """An INVALID_ARGUMENT body: the descriptions joined by newlines, and one
    google.rpc.BadRequest field violation per problem (``(description, field or None)``)."""
    violations = [
        {"field": field, "description": text} if field else {"description": text}
        for text, field in problems
    ]
    message = "\n".join(text for text, _ in problems)
    return google_error(
        400,
        "INVALID_ARGUMENT",
        message,
        [{"@type": BAD_REQUEST_TYPE, "fieldViolations": violations}],
    )


BAD_TOKEN_BODY: Final = fcm_error(
    400,
    "INVALID_ARGUMENT",
    "The registration token is not a valid FCM registration token",
    "INVALID_ARGUMENT",
)
_RETRY: Final = ((b"retry-after", b"%d" % RETRY_AFTER_SECONDS),)
_RULED: Final = frozenset(
    {"unregistered-", "mismatch-", "expired-", "invalid-", "fail-", "flaky-", "throttled-"}
    | {"expiredprovidertoken-"}
)


def _ruled(token: str) -> bool:
    """Whether the token's prefix calls for anything but a plain success (one lookup: this
    runs for every push)."""
    return token[: token.find("-") + 1] in _RULED


def fcm_outcome(
    state: SandboxState, token: str, message_id: str, *, dry_run: bool
) -> Outcome | None:
    """The FCM answer the token calls for, or None for a success.

    A dry run (``validate_only``) gets the permanent answers but consumes no one-shot
    failure, as Google validates without delivering.
    """
    if not _ruled(token):
        return None
    if token.startswith("unregistered-"):
        return (
            404,
            fcm_error(404, "NOT_FOUND", "Requested entity was not found.", "UNREGISTERED"),
            (),
        )
    if token.startswith("mismatch-"):
        return (
            403,
            fcm_error(403, "PERMISSION_DENIED", "SenderId mismatch", "SENDER_ID_MISMATCH"),
            (),
        )
    if token.startswith(("expired-", "invalid-")):
        return 400, BAD_TOKEN_BODY, ()
    if token.startswith("fail-"):
        return 500, fcm_error(500, "INTERNAL", "Internal error encountered.", "INTERNAL"), ()
    if dry_run:
        return None
    if token.startswith("flaky-") and state.once(token, message_id):
        body = fcm_error(503, "UNAVAILABLE", "The service is currently unavailable.", "UNAVAILABLE")
        return 503, body, _RETRY
    if token.startswith("throttled-") and state.once(token, message_id):
        body = fcm_error(
            429, "RESOURCE_EXHAUSTED", "Quota exceeded for the device.", "QUOTA_EXCEEDED"
        )
        return 429, body, _RETRY
    return None


def apns_outcome(
    state: SandboxState, token: str, apns_id: str, provider_jwt: str
) -> Outcome | None:
    """The APNs answer the token calls for, or None for a success."""
    if not _ruled(token):
        return None
    if token.startswith("unregistered-"):
        return 410, {"reason": "Unregistered", "timestamp": int(time.time() * 1000)}, ()
    if token.startswith("mismatch-"):
        return 400, {"reason": "DeviceTokenNotForTopic"}, ()
    if token.startswith("expiredprovidertoken-"):
        first = state.first_jwt.setdefault(token, provider_jwt)
        return (403, {"reason": "ExpiredProviderToken"}, ()) if first == provider_jwt else None
    if token.startswith("expired-"):
        return 410, {"reason": "ExpiredToken"}, ()
    if token.startswith("invalid-"):
        return 400, {"reason": "BadDeviceToken"}, ()
    if token.startswith("fail-"):
        return 500, {"reason": "InternalServerError"}, ()
    if token.startswith("flaky-") and state.once(token, apns_id):
        return 503, {"reason": "ServiceUnavailable"}, _RETRY
    if token.startswith("throttled-") and state.once(token, apns_id):
        return 429, {"reason": "TooManyRequests"}, _RETRY
    return None


async def wait_until_listening(host: str, port: int, within_seconds: float = 15.0) -> None:
    """Return once a TCP connection to ``host:port`` succeeds."""
    deadline = time.monotonic() + within_seconds
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
