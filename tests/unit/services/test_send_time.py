"""``send_at`` parsing: ISO 8601 basic and extended, always with an offset (property-based)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from campaign_trigger.errors import InvalidInput
from campaign_trigger.services.send_time import (
    IN_THE_PAST,
    INVALID_TIME,
    parse_send_at,
    resolve_send_at,
)

offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
moments = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31), timezones=offsets
).map(lambda d: d.replace(microsecond=0))


def _offset_text(moment: datetime, *, colon: bool) -> str:
    offset = moment.utcoffset()
    assert offset is not None
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}{':' if colon else ''}{rest:02d}"


@given(moments)
def test_basic_format_round_trips(moment: datetime) -> None:
    text = moment.strftime("%Y%m%dT%H%M%S") + _offset_text(moment, colon=False)
    assert parse_send_at(text) == moment


@given(moments)
def test_extended_format_round_trips(moment: datetime) -> None:
    text = moment.strftime("%Y-%m-%dT%H:%M:%S") + _offset_text(moment, colon=True)
    assert parse_send_at(text) == moment
    assert parse_send_at(moment.isoformat()) == moment


@given(moments)
def test_z_means_utc(moment: datetime) -> None:
    utc = moment.astimezone(UTC)
    assert parse_send_at(utc.strftime("%Y-%m-%dT%H:%M:%SZ")) == utc
    assert parse_send_at(utc.strftime("%Y%m%dT%H%M%SZ")) == utc


@given(moments)
def test_without_an_offset_the_time_is_refused(moment: datetime) -> None:
    for text in (moment.strftime("%Y-%m-%dT%H:%M:%S"), moment.strftime("%Y%m%dT%H%M%S")):
        with pytest.raises(InvalidInput) as caught:
            parse_send_at(text)
        assert caught.value.message == INVALID_TIME


@given(st.text(max_size=40))
def test_any_text_parses_to_an_aware_utc_time_or_is_invalid(text: str) -> None:
    message = None
    try:
        moment = parse_send_at(text)
    except InvalidInput as exc:
        message = exc.message
    else:
        assert moment.tzinfo == UTC
    assert message in (None, INVALID_TIME)


@given(st.integers(min_value=0, max_value=299))
def test_up_to_five_minutes_past_sends_now(seconds: int) -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    text = (now - timedelta(seconds=seconds)).isoformat()
    assert resolve_send_at(text, now=now) == now


@given(st.integers(min_value=301, max_value=10**8))
def test_more_than_five_minutes_past_is_refused(seconds: int) -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    with pytest.raises(InvalidInput) as caught:
        resolve_send_at((now - timedelta(seconds=seconds)).isoformat(), now=now)
    assert caught.value.message == IN_THE_PAST


@pytest.mark.parametrize("value", [None])
def test_absent_means_now(value: None) -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert resolve_send_at(value, now=now) == now


@pytest.mark.parametrize("value", [0, 1.5, [], {}, True])
def test_non_strings_are_invalid(value: object) -> None:
    with pytest.raises(InvalidInput):
        resolve_send_at(value, now=datetime.now(UTC))


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-22T10:15:00+01:00",
        "20261122T101500+0100",
        "2026-11-22T09:15:00Z",
        "2026-11-22T10:15:00.250+01:00",
        "20261122T091500Z",
    ],
)
def test_documented_examples(text: str) -> None:
    assert parse_send_at(text).replace(microsecond=0) == datetime(2026, 11, 22, 9, 15, tzinfo=UTC)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-22T10:15:00+24:00",
        "2026-02-30T10:15:00Z",
        "2026-11-22T10:15:60Z",
        "2026-11-22T10:15Z",
        "2026-11-22",
        "\uff12\uff10\uff12\uff16-11-22T10:15:00Z",
        " 2026-11-22T10:15:00Z",
        "2026-11-22t10:15:00z",
    ],
)
def test_near_misses_are_invalid(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_send_at(text)
