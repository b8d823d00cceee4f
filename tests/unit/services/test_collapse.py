"""The collapse identity of a message on a device."""

from __future__ import annotations

from campaign_trigger.services.delivering import collapse_id


def test_the_same_message_to_the_same_device_has_one_identity_and_fits_apns() -> None:
    first = collapse_id("r" * 32, 7, "device-" + "x" * 200)
    assert first == collapse_id("r" * 32, 7, "device-" + "x" * 200)
    assert len(first.encode("ascii")) <= 64  # apns-collapse-id's limit


def test_another_request_row_or_device_has_another_identity() -> None:
    identities = {
        collapse_id("r1", 0, "d1"),
        collapse_id("r2", 0, "d1"),
        collapse_id("r1", 1, "d1"),
        collapse_id("r1", 0, "d2"),
        collapse_id("r1", 10, ""),
        collapse_id("r1", 1, "0"),
    }
    assert len(identities) == 6
