"""Proofs an app install gives: its device secret, and the identity hash of a user.

* A **device secret** is handed to an install once, when it registers; the registry
  keeps only its SHA-256 (the secret has 256 random bits, so a fast hash is enough:
  nobody can guess a preimage). Every later call about the device sends it back.
* An **identity hash** is the HMAC-SHA256 of a user id under the app's identity key,
  made by the tenant's back-end for its signed-in user. With identity verification on,
  a device can log in only the users the back-end vouched for, so holding the app's
  SDK key (shipped in every copy of the app) is not enough to impersonate anyone.

Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final

DEVICE_SECRET_MARK: Final = "ds_"  # noqa: S105 (a prefix, not a secret)
IDENTITY_HASH_PATTERN: Final = r"^[0-9a-fA-F]{64}$"
_IDENTITY_HASH = re.compile(IDENTITY_HASH_PATTERN)


def new_device_secret() -> str:
    """A fresh device secret (256 random bits)."""
    return f"{DEVICE_SECRET_MARK}{secrets.token_urlsafe(32)}"


def hash_device_secret(secret: str) -> str:
    """What the registry stores of a device secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def device_secret_matches(secret: str | None, secret_hash: str | None) -> bool:
    """Whether ``secret`` is the one whose hash is stored (never for a device without)."""
    if not secret or not secret_hash:
        return False
    return hmac.compare_digest(hash_device_secret(secret), secret_hash)


def identity_hash(identity_key: str, user_id: str) -> str:
    """The HMAC-SHA256 (hex) of ``user_id`` under ``identity_key``: what a back-end sends."""
    return hmac.new(
        identity_key.encode("utf-8"), user_id.encode("utf-8"), hashlib.sha256
    ).hexdigest()


def identity_matches(identity_key: str, user_id: str, candidate: str | None) -> bool:
    """Whether ``candidate`` is the identity hash of ``user_id`` (hex, any case)."""
    if not identity_key or candidate is None or _IDENTITY_HASH.fullmatch(candidate) is None:
        return False  # an empty key would make every hash computable by anyone
    return hmac.compare_digest(identity_hash(identity_key, user_id), candidate.lower())
