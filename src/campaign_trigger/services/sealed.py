"""Secrets at rest: AES-256-GCM under a key derived from the service secret.

An app's provider credentials (a Google service-account JSON, an Apple ``.p8`` key) are
stored sealed: ``v1.`` + base64url(12-byte random nonce || ciphertext || 16-byte tag).
The key is :meth:`Settings.credentials_key` (HKDF-SHA256 of ``CT_SECRET_KEY`` or
``CT_HOME/secret.key``, a label of its own), so the database alone reveals nothing. The
associated data binds a sealed value to its place (``app:<app id>:fcm``): a value copied
into another app's row does not open there. A value that does not open — another secret,
a change of the secret, a tampered row — raises :class:`SealError`, whose message never
holds the secret.
"""

from __future__ import annotations

import base64
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from campaign_trigger.config import Settings

PREFIX: Final = "v1."
NONCE_BYTES: Final = 12


class SealError(ValueError):
    """A sealed value cannot be opened with this service's secret."""


def seal(settings: Settings, secret: bytes, *, context: str) -> str:
    """``secret`` encrypted and authenticated for ``context`` (text, safe to store)."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(settings.credentials_key()).encrypt(nonce, secret, context.encode())
    return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")


def unseal(settings: Settings, value: str, *, context: str) -> bytes:
    """The secret sealed by :func:`seal` for the same ``context``."""
    if not value.startswith(PREFIX):
        raise SealError(f"unknown sealed format for {context}")
    try:
        raw = base64.urlsafe_b64decode(value[len(PREFIX) :].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise SealError(f"sealed value for {context} is not base64") from None
    if len(raw) <= NONCE_BYTES + 16:
        raise SealError(f"sealed value for {context} is truncated")
    try:
        return AESGCM(settings.credentials_key()).decrypt(
            raw[:NONCE_BYTES], raw[NONCE_BYTES:], context.encode()
        )
    except InvalidTag:
        raise SealError(
            f"sealed credentials of {context} do not open with this service's secret "
            "(was CT_SECRET_KEY changed? set the credentials again)"
        ) from None
