"""Helpers shared by the FCM and APNs client tests (imported by name)."""

from __future__ import annotations

import time

from campaign_trigger.delivery.base import PushMessage

DATA = {"request_id": "r1", "campaign_id": "c1"}


def message(key: int, token: str, title: str = "Hello", body: str = "World") -> PushMessage:
    """A push message with fixed data."""
    return PushMessage(key=key, token=token, title=title, body=body, data=DATA)


class FakeClock:
    """Time that tests move by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now
