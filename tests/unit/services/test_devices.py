"""The device registry's registration rule: a push token belongs to one device of an app."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from sqlmodel import Session, select

from campaign_trigger.services.audience import APP_UNINSTALLED, AppTarget, resolve_targets
from campaign_trigger.services.devices import log_in, register_device
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import App, Channel, Device, Platform
from service_support import Org, make_org


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


def _installs_racing(url: str, installs: int) -> list[str]:
    """``installs`` new device ids of one app register the same token at once (each in its
    own transaction); the ids holding it afterwards."""
    upgrade(url)
    with Session(engine_for(url)) as session:
        app_id = make_org(session).app_id
    barrier = threading.Barrier(installs)
    failures: list[BaseException] = []

    def install(n: int) -> None:
        with Session(engine_for(url)) as session:
            barrier.wait()
            try:
                register_device(session=session, app_id=app_id, device_id=f"d{n}", push_token="t")
                session.commit()
            except Exception as exc:  # reported below
                failures.append(exc)

    threads = [threading.Thread(target=install, args=(n,)) for n in range(installs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    with Session(engine_for(url)) as session:
        holders = session.exec(
            select(Device.device_id).where(Device.app_id == app_id, Device.push_token == "t")
        ).all()
        registered = session.exec(select(Device).where(Device.app_id == app_id)).all()
    assert len(registered) == installs
    return list(holders)


def test_installs_registering_one_token_at_once_leave_it_to_one_on_sqlite(tmp_path: Path) -> None:
    assert len(_installs_racing(f"sqlite:///{tmp_path / 'race.db'}", installs=8)) == 1


@pytest.mark.postgres
def test_installs_registering_one_token_at_once_leave_it_to_one_on_postgresql(
    postgres_url: str,
) -> None:
    # Read committed: each one's take found no other holder yet (the others' rows were
    # not committed), and every one of them kept the token.
    assert len(_installs_racing(postgres_url, installs=8)) == 1
