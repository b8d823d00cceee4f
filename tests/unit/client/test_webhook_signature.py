"""A webhook signature made by the service verifies with the client's helper, and only
for the same body, the same secret and a recent timestamp."""

from __future__ import annotations

import time

from campaign_trigger.client import verify_signature
from campaign_trigger.client.webhooks import signature_header

SECRET = "whsec_test-secret"
BODY = b'{"id":"evt_1","type":"request.processed","data":{"request_id":"r"}}'


def test_a_signed_body_verifies() -> None:
    header = signature_header(BODY, SECRET)
    assert header.startswith("t=")
    assert ",v1=" in header
    assert verify_signature(BODY, header, SECRET)


def test_a_tampered_body_is_rejected() -> None:
    header = signature_header(BODY, SECRET)
    assert not verify_signature(BODY.replace(b'"r"', b'"x"'), header, SECRET)
    assert not verify_signature(BODY + b" ", header, SECRET)


def test_a_stale_or_future_timestamp_is_rejected() -> None:
    now = time.time()
    old = signature_header(BODY, SECRET, timestamp=int(now) - 301)
    assert not verify_signature(BODY, old, SECRET, now=now)
    assert verify_signature(BODY, old, SECRET, now=now, tolerance_seconds=600)
    ahead = signature_header(BODY, SECRET, timestamp=int(now) + 301)
    assert not verify_signature(BODY, ahead, SECRET, now=now)


def test_another_secret_a_changed_timestamp_or_a_malformed_header_is_rejected() -> None:
    header = signature_header(BODY, SECRET)
    assert not verify_signature(BODY, header, "whsec_other")
    timestamp, signature = header.split(",")
    moved = f"t={int(timestamp[2:]) + 1},{signature}"
    assert not verify_signature(BODY, moved, SECRET)
    for bad in (None, "", "v1=abc", "t=x,v1=abc", f"{timestamp},v0={signature[3:]}"):
        assert not verify_signature(BODY, bad, SECRET)


def test_any_of_several_v1_signatures_may_match() -> None:
    header = signature_header(BODY, SECRET)
    timestamp, signature = header.split(",")
    assert verify_signature(BODY, f"{timestamp},v1=00ff,{signature}", SECRET)
