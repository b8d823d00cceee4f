"""Report cells: formula injection neutralised, timestamps ISO 8601 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from campaign_trigger.services.reports import COLUMNS, iso_utc, neutralise


@pytest.mark.parametrize("cell", ["=1+1", "+33", "-2", "@SUM(A1)", "\tx", "\rx", "\nx"])
def test_formula_like_cells_are_neutralised(cell: str) -> None:
    assert neutralise(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["", "user-1", "a=b", "1"])
def test_ordinary_cells_are_kept(cell: str) -> None:
    assert neutralise(cell) == cell


def test_sent_at_is_iso_utc() -> None:
    moment = datetime(2026, 11, 22, 7, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert iso_utc(moment) == "2026-11-22T05:00:00.123456Z"
    assert datetime.fromisoformat(iso_utc(moment)) == moment.astimezone(UTC)
    assert iso_utc(None) == ""
    assert iso_utc(moment.astimezone(UTC).replace(tzinfo=None)) == "2026-11-22T05:00:00.123456Z"


def test_the_columns_are_the_spec_s() -> None:
    assert ",".join(COLUMNS) == (
        "app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,error_message"
    )
