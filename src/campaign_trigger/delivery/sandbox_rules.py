"""The sandbox's memory and rules, apart from HTTP (see ``delivery/sandbox.py``).

The device token's prefix decides the outcome (FCM answer / APNs answer):

* ``unregistered-``: 404 UNREGISTERED / 410 Unregistered with a timestamp
* ``mismatch-``: 403 SENDER_ID_MISMATCH / 400 DeviceTokenNotForTopic
* ``expired-``: 400 INVALID_ARGUMENT about the token / 410 ExpiredToken
* ``invalid-``: 400 INVALID_ARGUMENT about the token / 400 BadDeviceToken
* ``fail-``: 500 INTERNAL / 500 InternalServerError, always
* ``flaky-``: 503 UNAVAILABLE / 503 ServiceUnavailable with Retry-After, once; then 200
* ``throttled-``: 429 QUOTA_EXCEEDED / 429 TooManyRequests with Retry-After, once; then 200
* ``expiredprovidertoken-``: 200 / 403 ExpiredProviderToken for the first JWT seen, then 200
* anything else: 200

"Once" is per token and message (FCM: a hash of the message; APNs: its ``apns-id``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import jwt

from campaign_trigger.delivery.auth import JWT_BEARER
from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES
from campaign_trigger.delivery.mapping import BAD_REQUEST_TYPE, FCM_ERROR_TYPE

RETRY_AFTER_SECONDS: Final = 1
TOKEN_TTL_SECONDS: Final = 3599
PUSH_TYPES: Final = frozenset(
    {
        "alert",
        "background",
        "location",
        "voip",
        "complication",
        "fileprovider",
        "mdm",
        "liveactivity",
        "pushtotalk",
        "widgets",
        "controls",
    }
)

Body = dict[str, Any]


def google_error(code: int, status: str, message: str, details: list[Body] | None = None) -> Body:
    """A google.rpc.Status error body."""
    error: Body = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return {"error": error}


def fcm_error(code: int, status: str, message: str, error_code: str) -> Body:
    """A google.rpc.Status body with an FcmError detail."""
    return google_error(code, status, message, [{"@type": FCM_ERROR_TYPE, "errorCode": error_code}])


def bad_request(message: str, field: str) -> Body:
    """An INVALID_ARGUMENT body naming the offending field (google.rpc.BadRequest)."""
    violation = {"field": field, "description": message}
    return google_error(
        400,
        "INVALID_ARGUMENT",
        message,
        [{"@type": BAD_REQUEST_TYPE, "fieldViolations": [violation]}],
    )


BAD_TOKEN_BODY: Final = fcm_error(
    400,
    "INVALID_ARGUMENT",
    "The registration token is not a valid FCM registration token",
    "INVALID_ARGUMENT",
)


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


class SandboxState:
    """What the sandbox accepted, counted, and issued."""

    def __init__(self, *, latency_ms: float = 0) -> None:
        self.latency_ms = latency_ms
        self.access_tokens: set[str] = set()
        self.assertions: list[Body] = []  # the JWT-bearer assertions we were sent, decoded
        self.token_requests = 0
        self.clear()

    def clear(self) -> None:
        """Forget deliveries, counts and one-shot failures (not issued access tokens)."""
        self.deliveries: list[Body] = []
        self.requests_per_token: Counter[str] = Counter()
        self.per_token: Counter[str] = Counter()
        self.per_message: Counter[str] = Counter()
        self._failed_once: set[tuple[str, str]] = set()
        self._first_jwt: dict[str, str] = {}

    def configure(self, *, latency_ms: float | None = None) -> None:
        """Change the settings (only the latency for now)."""
        if latency_ms is not None:
            self.latency_ms = float(latency_ms)

    # OAuth ----------------------------------------------------------------------
    def issue_token(self, *, grant_type: str, assertion: str) -> tuple[int, Body]:
        """Google's token endpoint for the JWT-bearer grant (signatures are not checked)."""
        self.token_requests += 1
        if grant_type != JWT_BEARER:
            return 400, {
                "error": "unsupported_grant_type",
                "error_description": f"Invalid grant_type: {grant_type}",
            }
        try:
            header = jwt.get_unverified_header(assertion)
            claims = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT."}
        required = ("iss", "scope", "aud", "iat", "exp")
        if header.get("alg") != "RS256" or any(name not in claims for name in required):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT."}
        self.assertions.append({"header": header, "claims": claims})
        if str(claims["iss"]).startswith("denied"):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        token = f"ya29.sandbox-{secrets.token_urlsafe(24)}"
        self.access_tokens.add(token)
        return 200, {"access_token": token, "expires_in": TOKEN_TTL_SECONDS, "token_type": "Bearer"}

    # deliveries -----------------------------------------------------------------
    def _accept(self, record: Body) -> None:
        self.deliveries.append(record)
        self.per_token[record["token"]] += 1
        self.per_message[record["message_id"]] += 1

    def _once(self, token: str, message_id: str) -> bool:
        """True the first time this token and message are seen."""
        key = (token, message_id)
        if key in self._failed_once:
            return False
        self._failed_once.add(key)
        return True

    def deliveries_for(self, token: str | None) -> list[Body]:
        """Accepted payloads, all of them or one token's."""
        return [d for d in self.deliveries if token is None or d["token"] == token]

    def stats(self) -> Body:
        """Counts per token and per message id."""
        return {
            "deliveries": len(self.deliveries),
            "requests": sum(self.requests_per_token.values()),
            "token_requests": self.token_requests,
            "per_token": dict(self.per_token),
            "per_message": dict(self.per_message),
            "requests_per_token": dict(self.requests_per_token),
        }

    # FCM ------------------------------------------------------------------------
    def fcm_send(
        self, *, project: str, authorization: str, raw: bytes
    ) -> tuple[int, Body, dict[str, str] | None]:
        """FCM v1 ``messages:send``."""
        scheme, _, access_token = authorization.partition(" ")
        if scheme.lower() != "bearer" or access_token not in self.access_tokens:
            return (
                401,
                google_error(
                    401,
                    "UNAUTHENTICATED",
                    "Request had invalid authentication credentials. "
                    "Expected OAuth 2 access token, login cookie or other valid authentication "
                    "credential.",
                ),
                None,
            )
        if project.startswith("denied-"):
            return (
                403,
                google_error(
                    403,
                    "PERMISSION_DENIED",
                    f"Permission 'cloudmessaging.messages.create' denied "
                    f"on resource '//cloudresourcemanager.googleapis.com/projects/{project}' "
                    "(or it may not exist).",
                ),
                None,
            )
        try:
            message = json.loads(raw)["message"]
            token = message["token"]
        except (ValueError, KeyError, TypeError):
            return 400, bad_request("Invalid JSON payload received.", "message"), None
        if not isinstance(token, str) or not token:
            return 400, bad_request("Recipient of the message is not set.", "message"), None
        data = message.get("data") or {}
        for position, value in enumerate(data.values()):
            if not isinstance(value, str):
                text = f"Invalid value at 'message.data[{position}].value' (TYPE_STRING), {value}"
                return 400, bad_request(text, f"message.data[{position}].value"), None
        payload = {key: value for key, value in message.items() if key != "token"}
        size = len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())
        if size > MAX_PAYLOAD_BYTES:
            return 400, bad_request("Message is too big", "message"), None
        self.requests_per_token[token] += 1
        notification = message.get("notification") or {}
        canonical = json.dumps([token, notification, data], sort_keys=True).encode()
        message_id = "fcm-" + hashlib.sha256(canonical).hexdigest()[:32]
        answer = self._fcm_outcome(token, message_id)
        if answer is not None:
            return answer
        self._accept(
            {
                "platform": "android",
                "token": token,
                "message_id": message_id,
                "title": notification.get("title"),
                "body": notification.get("body"),
                "data": data,
                "payload": message,
                "received_at": time.time(),
            }
        )
        name = f"projects/{project}/messages/0:{time.time_ns()}%{secrets.token_hex(8)}"
        return 200, {"name": name}, None

    def _fcm_outcome(
        self, token: str, message_id: str
    ) -> tuple[int, Body, dict[str, str] | None] | None:
        if token.startswith("unregistered-"):
            return (
                404,
                fcm_error(404, "NOT_FOUND", "Requested entity was not found.", "UNREGISTERED"),
                None,
            )
        if token.startswith("mismatch-"):
            return (
                403,
                fcm_error(403, "PERMISSION_DENIED", "SenderId mismatch", "SENDER_ID_MISMATCH"),
                None,
            )
        if token.startswith(("expired-", "invalid-")):
            return 400, BAD_TOKEN_BODY, None
        if token.startswith("fail-"):
            return 500, fcm_error(500, "INTERNAL", "Internal error encountered.", "INTERNAL"), None
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        if token.startswith("flaky-") and self._once(token, message_id):
            return (
                503,
                fcm_error(
                    503, "UNAVAILABLE", "The service is currently unavailable.", "UNAVAILABLE"
                ),
                retry,
            )
        if token.startswith("throttled-") and self._once(token, message_id):
            return (
                429,
                fcm_error(
                    429, "RESOURCE_EXHAUSTED", "Quota exceeded for the device.", "QUOTA_EXCEEDED"
                ),
                retry,
            )
        return None

    # APNs -----------------------------------------------------------------------
    def apns_send(
        self, *, device_token: str, headers: Mapping[str, str], raw: bytes, http_version: str
    ) -> tuple[int, Body | None, dict[str, str]]:
        """APNs ``/3/device/{token}``; a None body means an empty 200."""
        apns_id = headers.get("apns-id") or str(uuid.uuid4()).upper()
        out = {"apns-id": apns_id}
        provider_jwt, reason = self._apns_check(headers, raw, apns_id)
        if reason is not None:
            status = {
                "MissingProviderToken": 403,
                "InvalidProviderToken": 403,
                "PayloadTooLarge": 413,
            }.get(reason, 400)
            return status, {"reason": reason}, out
        self.requests_per_token[device_token] += 1
        failure = self._apns_outcome(device_token, apns_id, provider_jwt)
        if failure is not None:
            status, body, extra = failure
            return status, body, {**out, **extra}
        document = json.loads(raw)
        alert = (document.get("aps") or {}).get("alert") or {}
        alert = alert if isinstance(alert, dict) else {"body": alert}
        self._accept(
            {
                "platform": "ios",
                "token": device_token,
                "message_id": apns_id,
                "title": alert.get("title"),
                "body": alert.get("body"),
                "data": {k: v for k, v in document.items() if k != "aps"},
                "payload": document,
                "topic": headers.get("apns-topic"),
                "provider_token_id": hashlib.sha256(provider_jwt.encode()).hexdigest()[:16],
                "http_version": http_version,
                "received_at": time.time(),
            }
        )
        return 200, None, out

    def _apns_check(
        self, headers: Mapping[str, str], raw: bytes, apns_id: str
    ) -> tuple[str, str | None]:
        scheme, _, provider_jwt = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not provider_jwt:
            return "", "MissingProviderToken"
        try:
            header = jwt.get_unverified_header(provider_jwt)
            claims = jwt.decode(provider_jwt, options={"verify_signature": False})
        except jwt.PyJWTError:
            return provider_jwt, "InvalidProviderToken"
        kid, iss = str(header.get("kid", "")), str(claims.get("iss", ""))
        if header.get("alg") != "ES256" or not kid or not iss or "iat" not in claims:
            return provider_jwt, "InvalidProviderToken"
        if kid.startswith("DENIED") or iss.startswith("DENIED"):
            return provider_jwt, "InvalidProviderToken"
        if not headers.get("apns-topic"):
            return provider_jwt, "MissingTopic"
        if headers.get("apns-push-type", "alert") not in PUSH_TYPES:
            return provider_jwt, "InvalidPushType"
        if headers.get("apns-priority", "10") not in ("1", "5", "10"):
            return provider_jwt, "BadPriority"
        if not headers.get("apns-expiration", "0").isdigit():
            return provider_jwt, "BadExpirationDate"
        try:
            uuid.UUID(apns_id)
        except ValueError:
            return provider_jwt, "BadMessageId"
        if not raw:
            return provider_jwt, "PayloadEmpty"
        if len(raw) > MAX_PAYLOAD_BYTES:
            return provider_jwt, "PayloadTooLarge"
        try:
            document = json.loads(raw)
        except ValueError:
            return provider_jwt, "PayloadEmpty"
        if not isinstance(document, dict) or not isinstance(document.get("aps"), dict):
            return provider_jwt, "PayloadEmpty"
        return provider_jwt, None

    def _apns_outcome(
        self, token: str, apns_id: str, provider_jwt: str
    ) -> tuple[int, Body, dict[str, str]] | None:
        if token.startswith("unregistered-"):
            return 410, {"reason": "Unregistered", "timestamp": int(time.time() * 1000)}, {}
        if token.startswith("mismatch-"):
            return 400, {"reason": "DeviceTokenNotForTopic"}, {}
        if token.startswith("expiredprovidertoken-"):
            first = self._first_jwt.setdefault(token, provider_jwt)
            if first == provider_jwt:
                return 403, {"reason": "ExpiredProviderToken"}, {}
            return None
        if token.startswith("expired-"):
            return 410, {"reason": "ExpiredToken"}, {}
        if token.startswith("invalid-"):
            return 400, {"reason": "BadDeviceToken"}, {}
        if token.startswith("fail-"):
            return 500, {"reason": "InternalServerError"}, {}
        retry = {"retry-after": str(RETRY_AFTER_SECONDS)}
        if token.startswith("flaky-") and self._once(token, apns_id):
            return 503, {"reason": "ServiceUnavailable"}, retry
        if token.startswith("throttled-") and self._once(token, apns_id):
            return 429, {"reason": "TooManyRequests"}, retry
        return None
