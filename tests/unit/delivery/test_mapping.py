"""Provider answers from the documentation (tests/fixtures/providers) → report outcomes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from campaign_trigger.delivery.mapping import Verdict, map_apns, map_fcm, retry_after_seconds

FIXTURES = Path(__file__).parents[2] / "fixtures" / "providers"


def case_id(case: dict[str, Any]) -> str:
    reason = case.get("body", {}).get("reason", "")
    return str(case.get("name") or f"{case['status']}-{reason}")


def cases(name: str) -> list[Any]:
    loaded: list[dict[str, Any]] = json.loads((FIXTURES / name).read_text())
    return [pytest.param(case, id=case_id(case)) for case in loaded]


def body_of(case: dict[str, Any]) -> bytes:
    if "raw" in case:
        return str(case["raw"]).encode()
    return json.dumps(case["body"]).encode()


def check(verdict: Verdict, expect: dict[str, Any]) -> None:
    assert verdict.error_message == expect["error_message"]
    assert verdict.retry == expect.get("retry", False)
    assert verdict.auth_failed == expect.get("auth_failed", False)
    assert verdict.refresh_auth == expect.get("refresh_auth", False)
    assert (verdict.unregistered_at is not None) == expect.get("unregistered", False)
    if "unregistered_at" in expect:
        assert verdict.unregistered_at == datetime.fromisoformat(expect["unregistered_at"])


@pytest.mark.parametrize("case", cases("fcm_errors.json"))
def test_fcm_documented_answers_map_to_report_values(case: dict[str, Any]) -> None:
    check(map_fcm(case["status"], body_of(case)), case["expect"])


@pytest.mark.parametrize("case", cases("apns_errors.json"))
def test_apns_documented_reasons_map_to_report_values(case: dict[str, Any]) -> None:
    check(map_apns(case["status"], body_of(case)), case["expect"])


def test_every_apple_reason_in_the_fixture_is_known_to_the_mapping() -> None:
    loaded = json.loads((FIXTURES / "apns_errors.json").read_text())
    reasons = {c["body"]["reason"] for c in loaded if "body" in c} - {"SomethingNew"}
    assert len(reasons) >= 30


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_transient_statuses_are_retried_even_with_unreadable_bodies(status: int) -> None:
    assert map_fcm(status, b"\xff not json").retry
    assert map_apns(status, b"").retry


def test_unregistered_without_timestamp_uses_now() -> None:
    verdict = map_apns(410, b'{"reason": "Unregistered"}')
    assert verdict.unregistered_at is not None
    assert abs(verdict.unregistered_at - datetime.now(UTC)) < timedelta(seconds=5)


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = datetime.now(UTC) + timedelta(seconds=30)
    seconds = retry_after_seconds(format_datetime(later, usegmt=True))
    assert seconds is not None
    assert 25 <= seconds <= 31
    assert retry_after_seconds("-3") == 0.0
