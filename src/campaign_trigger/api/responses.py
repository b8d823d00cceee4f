"""The documented error answers of each route, for ``responses=`` (the OpenAPI page)."""

from __future__ import annotations

from typing import Any

from campaign_trigger.schemas.api import ErrorBody

_DESCRIPTIONS = {
    400: "Bad request: one of the spec's messages (see the spec, section 7)",
    401: "Missing, malformed, forged, expired or revoked access token",
    403: "The account's role may not do this, or the link is invalid or expired",
    404: "Not found",
    409: "Idempotency-Key reused with a different body",
    413: "Upload or body over the size limit",
    429: "The organisation's API Trigger request quota is spent (see Retry-After)",
    503: "The scheduler (Prefect) or the database cannot be reached, or the database is "
    "busy; retry later (see Retry-After)",
}

QUOTA_HEADERS: dict[str, Any] = {
    "X-Quota-Remaining": {
        "description": "Units of the request quota left in this period.",
        "schema": {"type": "integer"},
    }
}


def errors(*codes: int, quota: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these error statuses."""
    entries: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _DESCRIPTIONS[code]}
        if code == 429:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds until the quota period ends.",
                    "schema": {"type": "integer"},
                },
            }
        entries[code] = entry
    return entries
