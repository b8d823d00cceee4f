"""The device registry: app SDK calls, and what providers learn about tokens and apps.

Keyword-only functions over a session (the API and the tasks call the same ones) and
:class:`DatabaseEvents`, the :class:`~campaign_trigger.delivery.sending.ProviderEvents`
that records unregistered tokens on their devices and flags an app whose provider
credentials were refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy import update
from sqlmodel import Session, col, select

from campaign_trigger.errors import InvalidInput, Unauthenticated
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.models import App, Device


def app_for_key(*, session: Session, sdk_key: str | None, app_id: str | None = None) -> App:
    """The app whose SDK key this is; Unauthenticated if none, or if it is not ``app_id``'s."""
    if not sdk_key:
        raise Unauthenticated("Missing app key")
    app = session.exec(select(App).where(App.sdk_key == sdk_key)).first()
    if app is None or (app_id is not None and app.app_id != app_id):
        raise Unauthenticated("Invalid app key")
    return app


def get_device(*, session: Session, app_id: str, device_id: str) -> Device:
    """A device of the app; InvalidInput if it was never registered."""
    device = session.exec(
        select(Device).where(Device.app_id == app_id, Device.device_id == device_id)
    ).first()
    if device is None:
        raise InvalidInput(f"The device {device_id} is not registered")
    return device


def register_device(
    *, session: Session, app_id: str, device_id: str, push_token: str | None
) -> Device:
    """Create or update a device. A NEW push token clears ``unregistered_at``."""
    now = datetime.now(UTC)
    device = session.exec(
        select(Device).where(Device.app_id == app_id, Device.device_id == device_id)
    ).first()
    if device is None:
        device = Device(app_id=app_id, device_id=device_id, user_id=None, logged_in=False)
    if push_token is not None and push_token != device.push_token:
        device.push_token = push_token
        device.unregistered_at = None
    device.uninstalled_at = None
    device.updated_at = now
    session.add(device)
    session.flush()
    return device


def log_in(*, session: Session, device: Device, user_id: str) -> Device:
    """``user_id`` is now the user logged in on the device."""
    device.user_id, device.logged_in, device.updated_at = user_id, True, datetime.now(UTC)
    session.add(device)
    return device


def log_out(*, session: Session, device: Device) -> Device:
    """Nobody is logged in on the device (the last user is kept for the report)."""
    device.logged_in, device.updated_at = False, datetime.now(UTC)
    session.add(device)
    return device


def set_opt_in(*, session: Session, device: Device, opted_in: bool) -> Device:
    """Opt the device in to push, or out."""
    device.opted_in, device.updated_at = opted_in, datetime.now(UTC)
    session.add(device)
    return device


def uninstall(*, session: Session, device: Device) -> Device:
    """The app reported its own uninstall (or the SDK did on its behalf)."""
    now = datetime.now(UTC)
    device.uninstalled_at, device.updated_at = now, now
    session.add(device)
    return device


def record_unregistered(*, session: Session, app_id: str, tokens: Mapping[str, datetime]) -> int:
    """Mark the app's devices holding these tokens unregistered; returns how many rows.

    One UPDATE per 500 tokens (each batch gets its earliest time).
    """
    changed = 0
    items = sorted(tokens.items(), key=lambda item: item[1])
    for start in range(0, len(items), 500):
        batch = items[start : start + 500]
        result = session.execute(
            update(Device)
            .where(
                col(Device.app_id) == app_id,
                col(Device.push_token).in_([token for token, _ in batch]),
                col(Device.unregistered_at).is_(None),
            )
            .values(unregistered_at=batch[0][1])
        )
        changed += int(getattr(result, "rowcount", 0) or 0)
    return changed


def flag_auth_failed(*, session: Session, app_id: str) -> None:
    """Record that the provider refused the app's credentials."""
    session.execute(
        update(App)
        .where(col(App.app_id) == app_id)
        .values(provider_auth_failed_at=datetime.now(UTC))
    )


class DatabaseEvents:
    """Provider events written to the database (off the event loop)."""

    def __init__(self, *, app_id: str, database_url: str) -> None:
        self.app_id = app_id
        self._database_url = database_url

    def _run(self, what: str, tokens: Mapping[str, datetime] | None = None) -> None:
        with Session(engine_for(self._database_url)) as session:
            if what == "auth":
                flag_auth_failed(session=session, app_id=self.app_id)
            else:
                record_unregistered(session=session, app_id=self.app_id, tokens=tokens or {})
            session.commit()

    async def auth_failed(self) -> None:
        """Flag the app."""
        await asyncio.to_thread(self._run, "auth")

    async def tokens_unregistered(self, tokens: Mapping[str, datetime]) -> None:
        """Mark the devices unregistered."""
        await asyncio.to_thread(self._run, "tokens", dict(tokens))
