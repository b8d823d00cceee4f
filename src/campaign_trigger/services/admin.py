"""Tenant administration: organisations, accounts, apps, campaigns and devices.

Used by ``campaign-trigger admin ...`` and by the demo seed. Every function either
does all it says or raises :class:`AdminError` with a one-line reason and changes
nothing (the caller's session is rolled back).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func
from sqlmodel import Session, col, select

from campaign_trigger.errors import AdminError
from campaign_trigger.services.campaign_content import CampaignContent
from campaign_trigger.services.passwords import hash_password
from campaign_trigger.store.models import (
    Account,
    App,
    Campaign,
    CampaignApp,
    CampaignState,
    Channel,
    Device,
    Organisation,
    Platform,
    Role,
)

if TYPE_CHECKING:
    from campaign_trigger.services.device_import import Progress

E = TypeVar("E", Role, Platform, Channel)


def _choice(kind: type[E], value: str, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise AdminError(f"Unknown {what} {value!r}: expected one of {allowed}") from None


def get_org(*, session: Session, name: str) -> Organisation:
    org = session.exec(select(Organisation).where(Organisation.name == name)).first()
    if org is None:
        raise AdminError(f"Unknown organisation {name!r}")
    return org


def create_org(*, session: Session, name: str, quota: int) -> Organisation:
    if not name.strip():
        raise AdminError("Organisation name must not be empty")
    if quota < 0:
        raise AdminError("Quota must be zero or more")
    if session.exec(select(Organisation).where(Organisation.name == name)).first():
        raise AdminError(f"Organisation {name!r} already exists")
    org = Organisation(name=name, request_quota=quota)
    session.add(org)
    session.flush()
    return org


def create_account(
    *, session: Session, org_name: str, email: str, password: str, role: str = "member"
) -> Account:
    org = get_org(session=session, name=org_name)
    checked_role = _choice(Role, role, "role")
    email = email.strip().lower()
    if "@" not in email or len(email) < 3:
        raise AdminError(f"Invalid e-mail address {email!r}")
    if len(password) < 8:
        raise AdminError("Password must have at least 8 characters")
    if session.exec(select(Account).where(Account.email == email)).first():
        raise AdminError(f"An account with e-mail {email!r} already exists")
    assert org.id is not None
    account = Account(
        org_id=org.id, email=email, password_hash=hash_password(password), role=checked_role
    )
    session.add(account)
    session.flush()
    return account


def create_app(*, session: Session, org_name: str, app_id: str, platform: str) -> App:
    org = get_org(session=session, name=org_name)
    checked_platform = _choice(Platform, platform, "platform")
    if not app_id.strip():
        raise AdminError("App id must not be empty")
    if session.exec(select(App).where(App.app_id == app_id)).first():
        raise AdminError(f"App {app_id!r} already exists")
    assert org.id is not None
    app = App(
        app_id=app_id,
        org_id=org.id,
        platform=checked_platform,
        sdk_key=f"sdk_{secrets.token_urlsafe(24)}",
    )
    session.add(app)
    session.flush()
    return app


def create_campaign(
    *,
    session: Session,
    org_name: str,
    app_ids: Sequence[str],
    channel: str,
    title: str,
    body: str,
    campaign_id: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Campaign:
    """A draft API-trigger campaign; its variables are the ``{{ name }}`` of its title,
    body, data values and image (``options``: the other fields of
    :class:`~campaign_trigger.services.campaign_content.CampaignContent`)."""
    org = get_org(session=session, name=org_name)
    checked_channel = _choice(Channel, channel, "channel")
    if not app_ids:
        raise AdminError("A campaign needs at least one --app-id")
    apps = session.exec(select(App).where(col(App.app_id).in_(app_ids))).all()
    found = {app.app_id for app in apps if app.org_id == org.id}
    missing = [app_id for app_id in app_ids if app_id not in found]
    if missing:
        raise AdminError(f"Unknown app {missing[0]!r} in organisation {org_name!r}")
    try:
        content = CampaignContent(title=title, body=body).changed(**(options or {}))
    except TypeError as exc:
        raise AdminError(f"Unknown campaign field: {exc}") from None
    _check_channel(checked_channel, content)
    if campaign_id is not None:
        if not campaign_id.strip():
            raise AdminError("Campaign id must not be empty")
        if session.get(Campaign, campaign_id) is not None:
            raise AdminError(f"Campaign {campaign_id!r} already exists")
    assert org.id is not None
    campaign = Campaign(org_id=org.id, channel=checked_channel, title=title, body=body)
    content.apply(campaign)
    if campaign_id is not None:
        campaign.id = campaign_id
    session.add(campaign)
    session.flush()
    for app_id in dict.fromkeys(app_ids):
        session.add(CampaignApp(campaign_id=campaign.id, app_id=app_id))
    session.flush()
    return campaign


def _check_channel(channel: Channel, content: CampaignContent) -> None:
    """In-app messages take the data, image and TTL (1 s or more) of a campaign, not the
    push options."""
    if channel != Channel.inapp:
        return
    pushed = [
        name
        for name in ("sound", "badge", "interruption_level", "thread_id", "category")
        if getattr(content, name) is not None
    ]
    if content.silent:
        pushed.append("silent")
    if content.priority != "high":
        pushed.append("priority")
    if pushed:
        raise AdminError(
            f"An in-app campaign has no {', '.join(pushed)}: those are push options "
            "(in-app messages take --data, --image and --ttl)"
        )
    if content.ttl_seconds == 0:  # an inbox entry expiring as it is published: never shown
        raise AdminError(
            "An in-app campaign's TTL must be at least 1 second: "
            "its messages expire as they are published (none would be shown)"
        )


def update_campaign(*, session: Session, campaign_id: str, changes: Mapping[str, Any]) -> Campaign:
    """Change a draft campaign's content (an empty string clears an optional field)."""
    campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise AdminError(f"Unknown campaign {campaign_id!r}")
    if campaign.state != CampaignState.draft:
        raise AdminError(
            f"Campaign {campaign_id!r} is {campaign.state.value}: only a draft campaign "
            "can be changed (its requests were checked against what it sends)"
        )
    if not changes:
        raise AdminError("Nothing to change: give at least one option")
    try:
        content = CampaignContent.of(campaign).changed(**changes)
    except TypeError as exc:
        raise AdminError(f"Unknown campaign field: {exc}") from None
    _check_channel(campaign.channel, content)
    content.apply(campaign)
    session.add(campaign)
    session.flush()
    return campaign


def _move_campaign(
    *, session: Session, campaign_id: str, from_state: CampaignState, to_state: CampaignState
) -> Campaign:
    campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise AdminError(f"Unknown campaign {campaign_id!r}")
    if campaign.state != from_state:
        raise AdminError(
            f"Campaign {campaign_id!r} is {campaign.state.value}: only a "
            f"{from_state.value} campaign can become {to_state.value}"
        )
    campaign.state = to_state
    session.add(campaign)
    session.flush()
    return campaign


def launch_campaign(*, session: Session, campaign_id: str) -> Campaign:
    """draft → started: the campaign accepts batches."""
    return _move_campaign(
        session=session,
        campaign_id=campaign_id,
        from_state=CampaignState.draft,
        to_state=CampaignState.started,
    )


def end_campaign(*, session: Session, campaign_id: str) -> Campaign:
    """started → ended: the campaign accepts no more batches."""
    return _move_campaign(
        session=session,
        campaign_id=campaign_id,
        from_state=CampaignState.started,
        to_state=CampaignState.ended,
    )


def import_devices(
    *, session: Session, app_id: str, path: Path, progress: Progress | None = None
) -> int:
    """Insert or update the devices of ``path`` (CSV) for an app; returns their number.

    The whole file is checked before anything is written (the first bad row refuses it);
    the writes are bulk (see :mod:`campaign_trigger.services.device_import`)."""
    # pyarrow is loaded by the one command that reads a device file, not by every one.
    from campaign_trigger.services.device_import import import_device_table, read_device_file

    app = session.exec(select(App).where(App.app_id == app_id)).first()
    if app is None:
        raise AdminError(f"Unknown app {app_id!r}")
    table = read_device_file(path)
    return import_device_table(session=session, app_id=app_id, devices=table, progress=progress)


def count_devices(*, session: Session, app_id: str) -> int:
    return int(
        session.exec(select(func.count()).select_from(Device).where(Device.app_id == app_id)).one()
    )
