"""Report cells: formula injection neutralised, timestamps ISO 8601 UTC (the database
makes the cells: on SQLite and on PostgreSQL)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlmodel import Session

from campaign_trigger.config import Settings
from campaign_trigger.services.reports import COLUMNS, neutralise, write_reports
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.files import Storage
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import Channel, Outcome
from service_support import Org, add_json_request, add_outcomes


@pytest.mark.parametrize("cell", ["=1+1", "+33", "-2", "@SUM(A1)", "\tx", "\rx", "\nx"])
def test_formula_like_cells_are_neutralised(cell: str) -> None:
    assert neutralise(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["", "user-1", "a=b", "1"])
def test_ordinary_cells_are_kept(cell: str) -> None:
    assert neutralise(cell) == cell


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind (PostgreSQL skips loudly when none answers)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reports.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    upgrade(url)
    return url


CELLS = ["=1+1", "+33", "-2", "@SUM(A1)", "\tx", "\rx", "\nx", "a\rb", 'q"q', "a,b", "", "é"]


def test_report_cells_and_times(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    request_id = create_request(
        session=session,
        settings=settings,
        storage=storage,
        org_id=org.org_id,
        request_id=f"=r-{org.org_id}",
        trigger=TriggerInput(
            campaign_id=org.campaign_id,
            messages=[{"user_id": "u", "template_variables": {"first_name": "N", "code": "C"}}],
        ),
    )
    east = timezone(timedelta(hours=2))
    times = [
        datetime(2026, 11, 22, 7, 0, 0, 123456, tzinfo=east),
        datetime(2026, 11, 22, 7, 0, 0, tzinfo=east),  # no microseconds: still six digits
        datetime(2026, 11, 22, 5, 0, 0, 5, tzinfo=UTC),
        None,
    ]
    for n, cell in enumerate(CELLS):
        sent = times[n % len(times)]
        session.add(
            Outcome(
                request_id=request_id,
                row_no=n,
                app_id=org.app_id,
                user_id=cell,
                device_id=CELLS[-1 - n],
                channel=Channel.push,
                sent_at=sent,
                error_message="" if sent else "FPErrPushFailed",
            )
        )
    session.commit()
    summary = write_reports(
        session=session,
        settings=settings,
        request_id=request_id,
        campaign_id="@campaign",
        app_ids=[org.app_id],
    )
    [key] = summary.report_paths
    with storage.open(key, "rb") as report:
        content = report.read().decode()
    rows = list(csv.reader(io.StringIO(content, newline="")))
    assert rows[0] == list(COLUMNS)
    expected = []
    for n, cell in enumerate(CELLS):
        sent = times[n % len(times)]
        expected.append(
            [
                org.app_id,
                "'@campaign",
                neutralise(cell),
                neutralise(CELLS[-1 - n]),
                sent.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if sent else "",
                neutralise(request_id),
                "push",
                "" if sent else "FPErrPushFailed",
            ]
        )
    assert rows[1:] == expected
    assert rows[2][4] == "2026-11-22T05:00:00.000000Z"
    assert content.endswith("\n")
    assert "\r\n" not in content  # rows end with a line feed
    assert summary.per_app[org.app_id] == {"": 9, "FPErrPushFailed": 3}


def test_a_download_under_way_reads_the_whole_old_report_while_it_is_written_again(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    """The settle sweep, or a run retried or taken over after its report, writes it again
    while its link may be streaming it: the download gets the old file whole."""
    request_id = add_json_request(session, org)

    def outcomes(first: int, error: str) -> None:
        add_outcomes(session, org, request_id, [error] * 2000, first=first)

    def write() -> str:
        [key] = write_reports(
            session=session,
            settings=settings,
            request_id=request_id,
            campaign_id=org.campaign_id,
            app_ids=[org.app_id],
        ).report_paths
        return key

    outcomes(0, "In progress")
    key = write()
    with storage.open(key, "rb") as old:
        expected = old.read()
    with storage.open(key, "rb") as download:
        start = download.read(100)
        outcomes(2000, "")  # the report written again, longer, as the download goes on
        assert write() == key
        rest = download.read()
    assert start + rest == expected
    with storage.open(key, "rb") as new:
        assert new.read().count(b"\n") == 4001  # the header and every row
    local = storage.local_path(key)
    assert local is not None
    assert [p.name for p in Path(local).parent.iterdir()] == [Path(local).name]


def test_the_columns_are_the_spec_s() -> None:
    assert ",".join(COLUMNS) == (
        "app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,error_message"
    )
