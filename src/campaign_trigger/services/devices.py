"""The device registry: app SDK calls, and what providers learn about tokens and apps.

Keyword-only functions over a session (the API, the admin CLI and the delivery call
the same ones): register, log in and out, opt in and out, uninstall, and what a
send learns (:func:`record_unregistered`, :func:`flag_auth_failed`).

SDK calls are authenticated twice: the app's SDK key names the app (it ships inside
every copy of the app, so it proves little), and the device secret handed out at
registration names the install (:mod:`~campaign_trigger.services.device_auth`). A
device that exists without a secret (imported by an operator) is claimed by the first
registration that shows its current push token.

A push token belongs to one device of an app: registering or importing it takes it from
the app's other devices (:func:`take_token`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, literal, text, update
from sqlmodel import Session, col, select

from campaign_trigger.errors import Conflict, Unauthenticated
from campaign_trigger.schemas.text import storable
from campaign_trigger.services.device_auth import (
    device_secret_matches,
    hash_device_secret,
    identity_matches,
    new_device_secret,
)
from campaign_trigger.store.models import App, Device, UTCDateTime

UNKNOWN_DEVICE = "Unknown device or wrong device secret"
DEVICE_TAKEN = (
    "The device {} is already registered: send its device secret (X-Device-Secret) to "
    "update it, or register this install under a new device id"
)
IDENTITY_REQUIRED = (
    "Identity verification is on for this app: send identity_hash, the HMAC-SHA256 of "
    "the user id under the app's identity key, made by your back-end"
)
BAD_IDENTITY = "The identity_hash does not match this user id"


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered device, and its device secret if this call created it (else None)."""

    device: Device
    device_secret: str | None


def app_for_key(*, session: Session, sdk_key: str | None, app_id: str | None = None) -> App:
    """The app whose SDK key this is; Unauthenticated if none, or if it is not ``app_id``'s."""
    if not sdk_key:
        raise Unauthenticated("Missing app key")
    app = None
    if storable(sdk_key):
        app = session.exec(select(App).where(App.sdk_key == sdk_key)).first()
    if app is None or (app_id is not None and app.app_id != app_id):
        raise Unauthenticated("Invalid app key")
    return app


def _find_device(*, session: Session, app_id: str, device_id: str) -> Device | None:
    if not storable(device_id):
        return None
    return session.exec(
        select(Device).where(Device.app_id == app_id, Device.device_id == device_id)
    ).first()


def authenticate_device(
    *, session: Session, app_id: str, device_id: str, device_secret: str | None
) -> Device:
    """The app's device, if ``device_secret`` is its secret; Unauthenticated otherwise,
    with the same message whether the device is unknown or the secret wrong."""
    device = _find_device(session=session, app_id=app_id, device_id=device_id)
    if device is None or not device_secret_matches(device_secret, device.secret_hash):
        raise Unauthenticated(UNKNOWN_DEVICE)
    return device


def register_device(
    *,
    session: Session,
    app_id: str,
    device_id: str,
    push_token: str | None,
    device_secret: str | None = None,
) -> Registration:
    """Create a device (a new secret comes back), or update one: a known device needs its
    secret (Unauthenticated if wrong, Conflict if absent); an unclaimed one (imported,
    no secret) needs its current push token. A NEW push token clears ``unregistered_at``
    and is taken from any other device of the app (:func:`take_token`).
    """
    now = datetime.now(UTC)
    device = _find_device(session=session, app_id=app_id, device_id=device_id)
    issued: str | None = None
    if device is None:
        issued = new_device_secret()
        device = Device(app_id=app_id, device_id=device_id, user_id=None, logged_in=False)
    elif device.secret_hash is not None:
        if device_secret is None:
            raise Conflict(DEVICE_TAKEN.format(device_id))
        if not device_secret_matches(device_secret, device.secret_hash):
            raise Unauthenticated(UNKNOWN_DEVICE)
    elif device.push_token is not None and push_token == device.push_token:
        issued = new_device_secret()  # an imported device, claimed by its own install
    else:
        raise Conflict(DEVICE_TAKEN.format(device_id))
    if issued is not None:
        device.secret_hash = hash_device_secret(issued)
    held = device.push_token
    refresh(device, push_token=push_token if push_token is not None else held, now=now)
    if device.push_token is not None and device.push_token != held:  # a token new to it
        take_token(
            session=session,
            app_id=app_id,
            push_token=device.push_token,
            device_id=device_id,
            now=now,
        )
    session.add(device)
    session.flush()
    return Registration(device=device, device_secret=issued)


def take_token(
    *, session: Session, app_id: str, push_token: str, device_id: str, now: datetime
) -> None:
    """``push_token`` is ``device_id``'s now: the app's other devices holding it lose it and
    count as uninstalled (its last user is kept for the report).

    A token names one install of the app on one phone. Another device id with it is an
    install that is gone (the app deleted and reinstalled: APNs gives the new install the
    same token) or that now reports under a new id; its last user may not be the
    phone's user any more, and a message for them must not reach the phone.

    On PostgreSQL it first waits for any other transaction taking the same token of the
    app to end: read committed, installs registering one token at once each found no
    other holder (none had committed) and every one of them kept it.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"device token {app_id} {push_token}"},
        )
    session.execute(
        update(Device)
        .where(
            col(Device.push_token) == push_token,
            col(Device.app_id) == app_id,
            col(Device.device_id) != device_id,
        )
        .values(
            push_token=None,
            uninstalled_at=func.coalesce(
                col(Device.uninstalled_at), literal(now, type_=UTCDateTime())
            ),
            updated_at=now,
        ),
        execution_options={"synchronize_session": "fetch"},
    )


def refresh(device: Device, *, push_token: str | None, now: datetime) -> None:
    """The rule of every (re)registration, by the app or by an import: a NEW push token
    clears ``unregistered_at`` (the provider's verdict was about the old one), and the
    app is installed again."""
    if push_token != device.push_token:
        device.push_token = push_token
        device.unregistered_at = None
    device.uninstalled_at = None
    device.updated_at = now


def upsert_devices(*, session: Session, app_id: str, rows: Sequence[Mapping[str, object]]) -> int:
    """Insert or update the app's devices (an operator's import); returns their number."""
    existing = {
        device.device_id: device
        for device in session.exec(select(Device).where(Device.app_id == app_id)).all()
    }
    now = datetime.now(UTC)
    for row in rows:
        device_id = str(row["device_id"])
        device = existing.get(device_id) or Device(app_id=app_id, device_id=device_id)
        token = row["push_token"]
        if token is not None:
            take_token(
                session=session, app_id=app_id, push_token=str(token), device_id=device_id, now=now
            )
        refresh(device, push_token=str(token) if token is not None else None, now=now)
        user = row["user_id"]
        device.user_id = str(user) if user is not None else None
        device.opted_in = bool(row["opted_in"])
        device.logged_in = bool(row["logged_in"])
        session.add(device)
    session.flush()
    return len(rows)


def log_in(
    *, session: Session, app: App, device: Device, user_id: str, identity_hash: str | None
) -> Device:
    """``user_id`` is now the user logged in on the device. With the app's identity
    verification on, ``identity_hash`` must vouch for the user (Unauthenticated if not)."""
    if app.identity_verification:
        if identity_hash is None:
            raise Unauthenticated(IDENTITY_REQUIRED)
        if not identity_matches(app.identity_key, user_id, identity_hash):
            raise Unauthenticated(BAD_IDENTITY)
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
