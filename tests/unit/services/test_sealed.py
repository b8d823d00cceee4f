"""Secrets at rest: sealed under the service secret, bound to their place."""

from __future__ import annotations

import pytest

from campaign_trigger.config import Settings
from campaign_trigger.services.sealed import SealError, seal, unseal

SECRET = b"-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"


def test_a_sealed_secret_opens_only_in_its_place_and_never_shows() -> None:
    settings = Settings(secret_key="k" * 40)
    sealed = seal(settings, SECRET, context="app:a1:apns")

    assert unseal(settings, sealed, context="app:a1:apns") == SECRET
    assert b"MIGHAgEA" not in sealed.encode()
    assert seal(settings, SECRET, context="app:a1:apns") != sealed  # a fresh nonce each time
    with pytest.raises(SealError):
        unseal(settings, sealed, context="app:a2:apns")  # copied into another app's row


def test_another_secret_or_a_tampered_value_does_not_open() -> None:
    settings = Settings(secret_key="k" * 40)
    sealed = seal(settings, SECRET, context="c")

    with pytest.raises(SealError, match="CT_SECRET_KEY") as refused:
        unseal(Settings(secret_key="j" * 40), sealed, context="c")
    assert "MIGHAgEA" not in str(refused.value)
    flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    for broken in (flipped, sealed[:10], "v2." + sealed[3:], "v1.!!!"):
        with pytest.raises(SealError):
            unseal(settings, broken, context="c")


def test_the_credentials_key_is_its_own() -> None:
    settings = Settings(secret_key="k" * 40)
    keys = {settings.credentials_key(), settings.token_key(), settings.link_key()}
    assert len(keys) == 3
    assert all(len(key) == 32 for key in keys)
