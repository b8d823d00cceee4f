"""The sandbox's memory: what it accepted, counted and issued (apart from HTTP).

A delivery is kept compactly (the raw payload, parsed again only when inspected), so a
process holds millions. Counts: per device token, per message id, per token and
collapse id (``per_token_collapse``: a re-send of the same notification shares its
collapse id, so a count above 1 there is a duplicate the device would replace, not
show twice), and requests per token (failed attempts included).
"""

from __future__ import annotations

import secrets
import time
from collections import Counter, defaultdict
from typing import Any, Final, NamedTuple

import orjson

from campaign_trigger.delivery.sandbox_keys import KeyRing

ACCESS_TOKEN_TTL_SECONDS: Final = 3599


class Delivery(NamedTuple):
    """One accepted push. Only strings, bytes and numbers: CPython's collector stops
    tracking such tuples, so millions of them cost no garbage-collection time."""

    platform: str  # "android" or "ios"
    token: str
    message_id: str
    collapse_id: str | None
    payload: bytes  # FCM: the request body; APNs: the JSON payload
    received_at: float
    # topic, push type, provider token id, HTTP version, apns-priority, apns-expiration
    apns: tuple[str, str, str, str, str, str] | None
    signer: tuple[str, str] = ("", "")  # the key id that signed, its team id / account e-mail
    project: str = ""  # FCM: the project of the send's URL


class AccessToken(NamedTuple):
    expires_at: float  # time.monotonic()
    client_email: str
    may_send: bool  # its scopes allow FCM sends
    key_id: str = ""  # the service-account key that signed the assertion


class SandboxState:
    """What the sandbox accepted, counted, and issued."""

    def __init__(self, *, latency_ms: float = 0, keys: KeyRing | None = None) -> None:
        self.latency_ms = latency_ms
        self.keys = keys or KeyRing()
        self.access_tokens: dict[str, AccessToken] = {}
        self.assertions: list[dict[str, Any]] = []  # JWT-bearer assertions accepted, decoded
        self.token_requests = 0
        self.verified_jwts: dict[bytes, Any] = {}  # APNs provider tokens already checked
        self.clear()

    def clear(self) -> None:
        """Forget deliveries, counts and one-shot failures (not keys nor access tokens)."""
        self.deliveries: list[Delivery] = []
        self.requests_per_token: Counter[str] = Counter()
        self.per_token: Counter[str] = Counter()
        self.per_message: Counter[str] = Counter()
        self._collapse: Counter[tuple[str, str]] = Counter()
        self.validated = 0  # FCM validate_only requests that passed
        self.failed_once: set[tuple[str, str]] = set()
        self.first_jwt: dict[str, str] = {}

    def configure(self, *, latency_ms: float | None = None) -> None:
        """Change the settings (only the latency for now)."""
        if latency_ms is not None:
            if latency_ms < 0:
                raise ValueError("latency_ms must be >= 0")
            self.latency_ms = float(latency_ms)

    def latency_seconds(self) -> float:
        """How long provider answers wait."""
        return self.latency_ms / 1000

    # access tokens ------------------------------------------------------------------
    def issue_access_token(self, *, client_email: str, may_send: bool, key_id: str = "") -> str:
        """A new ``ya29.`` bearer token valid for :data:`ACCESS_TOKEN_TTL_SECONDS`."""
        token = f"ya29.sandbox-{secrets.token_urlsafe(24)}"
        expires = time.monotonic() + ACCESS_TOKEN_TTL_SECONDS
        self.access_tokens[token] = AccessToken(expires, client_email, may_send, key_id)
        return token

    # deliveries ---------------------------------------------------------------------
    def accept(self, delivery: Delivery) -> None:
        """Record an accepted push and count it."""
        # dict.get, not Counter's +=: a new key would cost a Python-level __missing__ call
        self.deliveries.append(delivery)
        token, per_token, per_message = delivery.token, self.per_token, self.per_message
        per_token[token] = per_token.get(token, 0) + 1
        per_message[delivery.message_id] = per_message.get(delivery.message_id, 0) + 1
        key = (token, delivery.collapse_id or "")
        self._collapse[key] = self._collapse.get(key, 0) + 1

    def attempted(self, token: str) -> None:
        """Count a request for ``token`` (whatever its answer)."""
        self.requests_per_token[token] = self.requests_per_token.get(token, 0) + 1

    def once(self, token: str, message_id: str) -> bool:
        """True the first time this token and message are seen (one-shot failures)."""
        key = (token, message_id)
        if key in self.failed_once:
            return False
        self.failed_once.add(key)
        return True

    @property
    def per_token_collapse(self) -> defaultdict[str, dict[str, int]]:
        """``{token: {collapse id or "": count}}`` of accepted pushes (a snapshot; a token
        never pushed to reads as ``{}``)."""
        nested: defaultdict[str, dict[str, int]] = defaultdict(dict)
        for (token, collapse_id), count in dict(self._collapse).items():
            nested[token][collapse_id] = count
        return nested

    def deliveries_for(self, token: str | None) -> list[dict[str, Any]]:
        """Accepted pushes as JSON-ready records, all of them or one token's."""
        return [_describe(d) for d in list(self.deliveries) if token is None or d.token == token]

    def stats(self) -> dict[str, Any]:
        """Counts per token, per message id and per token and collapse id."""
        return {
            "deliveries": len(self.deliveries),
            "requests": sum(dict(self.requests_per_token).values()),
            "token_requests": self.token_requests,
            "validated": self.validated,
            "per_token": dict(self.per_token),
            "per_message": dict(self.per_message),
            "per_token_collapse": dict(self.per_token_collapse),
            "requests_per_token": dict(self.requests_per_token),
        }


def _describe(delivery: Delivery) -> dict[str, Any]:
    document = orjson.loads(delivery.payload)
    if delivery.platform == "android":
        message = document.get("message") or {}
        notification = message.get("notification") or {}
        title, body, data = notification.get("title"), notification.get("body"), message.get("data")
        payload = message
    else:
        alert = (document.get("aps") or {}).get("alert") or {}
        alert = alert if isinstance(alert, dict) else {"body": alert}
        title, body = alert.get("title"), alert.get("body")
        data = {key: value for key, value in document.items() if key != "aps"}
        payload = document
    return {
        "platform": delivery.platform,
        "token": delivery.token,
        "message_id": delivery.message_id,
        "collapse_id": delivery.collapse_id,
        "title": title,
        "body": body,
        "data": data or {},
        "payload": payload,
        "received_at": delivery.received_at,
        "key_id": delivery.signer[0],
        **_signer_fields(delivery),
        **_apns_fields(delivery.apns),
    }


def _signer_fields(delivery: Delivery) -> dict[str, str]:
    if delivery.platform == "android":
        return {"client_email": delivery.signer[1], "project": delivery.project}
    return {"team_id": delivery.signer[1]}


def _apns_fields(apns: tuple[str, str, str, str, str, str] | None) -> dict[str, str]:
    if apns is None:
        return {}
    topic, push_type, provider_token_id, http_version, priority, expiration = apns
    return {
        "topic": topic,
        "push_type": push_type,
        "provider_token_id": provider_token_id,
        "http_version": http_version,
        "priority": priority,
        "expiration": expiration,
    }
