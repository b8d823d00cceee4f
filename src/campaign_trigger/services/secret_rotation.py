"""Changing the service secret (``CT_SECRET_KEY``, or ``CT_HOME/secret.key``).

The secret seals the apps' provider credentials and the webhook endpoints' signing
secrets (``services/sealed.py``); after a change they no longer open. :func:`reseal_all`
opens each with the old secret and seals it again with the current one, in the caller's
transaction, so a value that opens with neither leaves every row as it was. A value that
already opens with the current secret is left alone: a repeated run changes nothing.
Access tokens and signed links, also derived from the secret, are not stored: after the
change users sign in again and links are asked for again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import SecretStr
from sqlmodel import Session, select

from campaign_trigger.config import Settings
from campaign_trigger.services import app_credentials, webhooks
from campaign_trigger.services.sealed import SealError, seal, unseal
from campaign_trigger.store.models import AppCredentials, WebhookEndpoint


@dataclass(frozen=True)
class Resealed:
    credentials: int  # app credentials sealed again with the current secret
    webhooks: int  # webhook signing secrets sealed again
    current: int  # values that already opened with the current secret


def with_secret(settings: Settings, secret: str) -> Settings:
    """``settings`` with another service secret (the old one, to open what it sealed)."""
    return settings.model_copy(update={"secret_key": SecretStr(secret)})


def _resealed(value: str, *, context: str, old: Settings, new: Settings) -> str | None:
    """``value`` sealed with the current secret, or None when it already is."""
    try:
        unseal(new, value, context=context)
        return None
    except SealError:
        pass
    try:
        secret = unseal(old, value, context=context)
    except SealError:
        raise SealError(f"{context} opens with neither the old nor the current secret") from None
    return seal(new, secret, context=context)


def reseal_all(*, session: Session, old: Settings, new: Settings) -> Resealed:
    """Every sealed secret moved from ``old``'s secret to ``new``'s (the caller commits;
    :class:`SealError` naming the first value that opens with neither)."""
    counts = {"credentials": 0, "webhooks": 0, "current": 0}
    for row in session.exec(select(AppCredentials)).all():
        context = app_credentials.sealed_context(row.app_id, row.service)
        moved = _resealed(row.sealed_secret, context=context, old=old, new=new)
        counts["current" if moved is None else "credentials"] += 1
        if moved is not None:
            row.sealed_secret = moved
            session.add(row)
    for endpoint in session.exec(select(WebhookEndpoint)).all():
        context = webhooks.secret_context(endpoint.id)
        moved = _resealed(endpoint.sealed_secret, context=context, old=old, new=new)
        counts["current" if moved is None else "webhooks"] += 1
        if moved is not None:
            endpoint.sealed_secret = moved
            session.add(endpoint)
    session.flush()
    return Resealed(**counts)
