"""The device registry's registration rule: a push token belongs to one device of an app."""

from __future__ import annotations

import uuid

from sqlmodel import Session, select

from campaign_trigger.services.audience import APP_UNINSTALLED, AppTarget, resolve_targets
from campaign_trigger.services.devices import log_in, register_device
from campaign_trigger.store.models import App, Channel, Device, Platform
from service_support import Org


def _register(session: Session, app_id: str, device_id: str, token: str, user_id: str) -> None:
    """A new install registers ``token`` and ``user_id`` logs in on it."""
    app = session.exec(select(App).where(App.app_id == app_id)).one()
    device = register_device(
        session=session, app_id=app_id, device_id=device_id, push_token=token
    ).device
    log_in(session=session, app=app, device=device, user_id=user_id, identity_hash=None)
    session.commit()


def _targets(session: Session, app_id: str, users: list[str]) -> list[tuple[str, str, str, str]]:
    targets = resolve_targets(
        session=session,
        users=users,
        apps=[AppTarget(app_id, Platform.ios)],
        channel=Channel.push,
    )
    return [(t.user_id, t.device_id, t.token, t.error_message) for t in targets]


def test_a_token_registered_by_a_new_install_no_longer_reaches_the_old_installs_user(
    session: Session, org: Org
) -> None:
    # the app deleted and reinstalled: a new device id, the same APNs token, another user
    _register(session, org.app_id, "d1", "token-t", "alice")
    _register(session, org.app_id, "d2", "token-t", "bob")
    assert _targets(session, org.app_id, ["alice", "bob"]) == [
        ("alice", "d1", "", APP_UNINSTALLED),
        ("bob", "d2", "token-t", ""),
    ]
    old = session.exec(select(Device).where(Device.device_id == "d1")).one()
    assert (old.push_token, old.user_id, old.uninstalled_at is not None) == (None, "alice", True)


def test_the_same_user_on_the_reinstalled_app_is_sent_to_once(session: Session, org: Org) -> None:
    _register(session, org.app_id, "d1", "token-t", "alice")
    _register(session, org.app_id, "d2", "token-t", "alice")
    sendable = [t for t in _targets(session, org.app_id, ["alice"]) if not t[3]]
    assert sendable == [("alice", "d2", "token-t", "")]


def test_the_same_token_in_another_app_is_left_alone(session: Session, org: Org) -> None:
    first = session.exec(select(App).where(App.app_id == org.app_id)).one()
    other = App(
        app_id=f"other-{uuid.uuid4().hex[:8]}",
        org_id=org.org_id,
        platform=Platform.ios,
        sdk_key=uuid.uuid4().hex,
    )
    session.add(other)
    session.commit()
    _register(session, first.app_id, "d1", "token-t", "alice")
    _register(session, other.app_id, "d1", "token-t", "alice")
    _register(session, other.app_id, "d2", "token-u", "bob")
    assert _targets(session, first.app_id, ["alice"]) == [("alice", "d1", "token-t", "")]
    assert _targets(session, other.app_id, ["alice"]) == [("alice", "d1", "token-t", "")]


def test_a_device_registering_its_own_token_again_keeps_it(session: Session, org: Org) -> None:
    first = register_device(session=session, app_id=org.app_id, device_id="d1", push_token="t")
    session.commit()
    again = register_device(
        session=session,
        app_id=org.app_id,
        device_id="d1",
        push_token="t",
        device_secret=first.device_secret,
    )
    session.commit()
    assert (again.device.push_token, again.device.uninstalled_at) == ("t", None)
