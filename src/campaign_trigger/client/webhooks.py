"""Completion webhooks' signatures, Stripe-style: make one (the service) and check one
(a receiver).

Every event is POSTed with the header::

    Campaign-Trigger-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

keyed with the endpoint's secret (``whsec_...``, shown once when it was registered).
A receiver checks it on the body's raw bytes, before parsing them::

    from campaign_trigger.client import verify_signature

    if not verify_signature(body, headers["Campaign-Trigger-Signature"], secret):
        ...  # answer 400: not from us, altered, or replayed long after

A retried event keeps its id (``event["id"]``): use it to ignore a repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Final

SIGNATURE_HEADER: Final = "Campaign-Trigger-Signature"
DEFAULT_TOLERANCE_SECONDS: Final = 300


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = f"{timestamp}.".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(body: bytes, secret: str, *, timestamp: int | None = None) -> str:
    """The ``Campaign-Trigger-Signature`` value for ``body`` sent now (or at ``timestamp``)."""
    moment = int(time.time()) if timestamp is None else timestamp
    return f"t={moment},v1={_digest(secret, moment, body)}"


def verify_signature(
    body: bytes,
    header: str | None,
    secret: str,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs exactly ``body`` with ``secret``, made within
    ``tolerance_seconds`` of ``now`` (an old signature is a replay)."""
    fields: dict[str, list[str]] = {}
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_seconds:
        return False
    expected = _digest(secret, timestamp, body)
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))
