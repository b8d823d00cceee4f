"""Pre-send outcomes of a device, and deterministic chunking."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from campaign_trigger.services.audience import (
    APP_UNINSTALLED,
    NOT_LOGGED_IN,
    OPT_OUT,
    _pre_send_outcome,
    chunk_count,
)
from campaign_trigger.store.models import Channel

NOW = datetime.now(UTC)


def outcome(channel: Channel = Channel.push, **changes: object) -> str:
    device: dict[str, object] = {
        "token": "t",
        "opted_in": True,
        "logged_in": True,
        "unregistered_at": None,
        "uninstalled_at": None,
    }
    device.update(changes)
    return _pre_send_outcome(channel=channel, **device)  # type: ignore[arg-type]


def test_a_reachable_device_is_sent_to() -> None:
    assert outcome() == ""


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"unregistered_at": NOW}, APP_UNINSTALLED),
        ({"uninstalled_at": NOW}, APP_UNINSTALLED),
        ({"logged_in": False}, NOT_LOGGED_IN),
        ({"opted_in": False}, OPT_OUT),
        ({"token": None}, OPT_OUT),
        ({"unregistered_at": NOW, "logged_in": False, "opted_in": False}, APP_UNINSTALLED),
        ({"logged_in": False, "opted_in": False}, NOT_LOGGED_IN),
    ],
)
def test_pre_send_outcomes_in_order_of_precedence(
    changes: dict[str, object], expected: str
) -> None:
    assert outcome(**changes) == expected


def test_push_opt_out_does_not_stop_in_app_messages() -> None:
    assert outcome(Channel.inapp, opted_in=False, token=None) == ""


@pytest.mark.parametrize(
    ("messages", "size", "chunks"),
    [(0, 5, 0), (1, 5, 1), (5, 5, 1), (6, 5, 2), (1_000_000, 5000, 200)],
)
def test_chunk_count(messages: int, size: int, chunks: int) -> None:
    assert chunk_count(messages, size) == chunks
