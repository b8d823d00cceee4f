"""Signed, expiring links: HMAC-SHA256 of path and expiry with the links' own key
(derived from the secret, apart from the key of access tokens)."""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote, urlencode

from campaign_trigger.config import Settings


def _signature(*, key: bytes, path: str, expires: int) -> str:
    message = f"{path}\n{expires}".encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signed_url(*, settings: Settings, path: str, now: float | None = None) -> str:
    """An absolute URL for ``path`` (a route path such as ``/files/reports/x.csv``) valid
    ``settings.link_ttl_seconds`` from ``now``."""
    expires = int((time.time() if now is None else now) + settings.link_ttl_seconds)
    signature = _signature(key=settings.link_key(), path=path, expires=expires)
    query = urlencode({"expires": expires, "signature": signature})
    return f"{settings.public_base_url.rstrip('/')}{quote(path)}?{query}"


def verify(
    *, settings: Settings, path: str, expires: int, signature: str, now: float | None = None
) -> bool:
    """Whether the signature is ours for this path and expiry, and not expired."""
    if expires < (time.time() if now is None else now):
        return False
    expected = _signature(key=settings.link_key(), path=path, expires=expires)
    return hmac.compare_digest(expected, signature)
