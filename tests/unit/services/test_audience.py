"""Pre-send outcomes of a device (as decided and as read from the database), and
deterministic chunking."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session

from campaign_trigger.services.audience import (
    APP_UNINSTALLED,
    NO_DEVICE,
    NOT_LOGGED_IN,
    OPT_OUT,
    AppTarget,
    _pre_send_outcome,
    chunk_count,
    resolve_targets,
)
from campaign_trigger.store.models import Channel, Device, Platform
from service_support import Org

NOW = datetime.now(UTC)


def outcome(channel: Channel = Channel.push, **changes: object) -> str:
    device: dict[str, object] = {
        "token": "t",
        "opted_in": True,
        "logged_in": True,
        "gone": False,
    }
    device.update(changes)
    return _pre_send_outcome(channel=channel, **device)  # type: ignore[arg-type]


def test_a_reachable_device_is_sent_to() -> None:
    assert outcome() == ""


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"gone": True}, APP_UNINSTALLED),
        ({"logged_in": False}, NOT_LOGGED_IN),
        ({"opted_in": False}, OPT_OUT),
        ({"token": None}, OPT_OUT),
        ({"gone": True, "logged_in": False, "opted_in": False}, APP_UNINSTALLED),
        ({"logged_in": False, "opted_in": False}, NOT_LOGGED_IN),
    ],
)
def test_pre_send_outcomes_in_order_of_precedence(changes: dict[str, Any], expected: str) -> None:
    assert outcome(**changes) == expected


def test_push_opt_out_does_not_stop_in_app_messages() -> None:
    assert outcome(Channel.inapp, opted_in=False, token=None) == ""


def test_targets_read_from_the_database(session: Session, org: Org) -> None:
    devices: dict[str, dict[str, Any]] = {
        "ok": {},
        "unregistered": {"unregistered_at": NOW},
        "uninstalled": {"uninstalled_at": NOW},
        "logged-out": {"logged_in": False},
        "opted-out": {"opted_in": False},
        "no-token": {"push_token": None},
    }
    for name, changes in devices.items():
        fields: dict[str, Any] = {"push_token": f"t-{name}", **changes}
        session.add(Device(app_id=org.app_id, device_id=name, user_id=f"u-{name}", **fields))
    session.add(Device(app_id=org.app_id, device_id="ok-2", user_id="u-ok", push_token="t-2"))
    session.commit()
    users = [*(f"u-{name}" for name in devices), "u-nobody", "u-ok"]
    targets = resolve_targets(
        session=session,
        users=users,
        apps=[AppTarget(org.app_id, Platform.android)],
        channel=Channel.push,
    )
    assert [(t.row, t.user_id, t.device_id, t.token, t.error_message) for t in targets] == [
        (0, "u-ok", "ok", "t-ok", ""),
        (0, "u-ok", "ok-2", "t-2", ""),
        (1, "u-unregistered", "unregistered", "t-unregistered", APP_UNINSTALLED),
        (2, "u-uninstalled", "uninstalled", "t-uninstalled", APP_UNINSTALLED),
        (3, "u-logged-out", "logged-out", "t-logged-out", NOT_LOGGED_IN),
        (4, "u-opted-out", "opted-out", "t-opted-out", OPT_OUT),
        (5, "u-no-token", "no-token", "", OPT_OUT),
        (6, "u-nobody", "", "", NO_DEVICE),
        (7, "u-ok", "ok", "t-ok", ""),
        (7, "u-ok", "ok-2", "t-2", ""),
    ]


@pytest.mark.parametrize(
    ("messages", "size", "chunks"),
    [(0, 5, 0), (1, 5, 1), (5, 5, 1), (6, 5, 2), (1_000_000, 5000, 200)],
)
def test_chunk_count(messages: int, size: int, chunks: int) -> None:
    assert chunk_count(messages, size) == chunks
