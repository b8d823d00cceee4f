"""Report files through the real server: values that hold line breaks or start like a
formula, registered through the device routes and requested through the trigger API,
come back in the downloaded CSV as one cell each, none starting a formula."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from api_devices import log_in, register, tenant_app
from api_tenants import Server, Tenant

from campaign_trigger.config import get_settings
from campaign_trigger.services import reports
from campaign_trigger.services.reports import COLUMNS
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Channel, Outcome

FORMULA_STARTS = ("=", "+", "-", "@", "\t")
# (device id, user id): each would start a row, or a formula, if written bare
HOSTILE = [
    ("dev\r=2+2", "x\r=3+3"),
    ("dev\n@SUM(A1)", "y\n+4+4"),
    ("dev\r\n-5+5", "\t=6+6"),
    ('=HYPERLINK("x")', "@user"),
    ('dev"q",=7+7', "-8"),
]


@pytest.fixture
def http(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


def test_line_breaks_and_formula_starts_stay_inside_their_cell(
    http: httpx.Client, tenant: Tenant
) -> None:
    app = tenant_app(tenant)
    for n, (device_id, user_id) in enumerate(HOSTILE):
        secret = register(http, app, device_id, f"token-{n}")
        assert log_in(http, app, device_id, secret, user_id).status_code == 200
    created = http.post(
        "/api/campaigns/trigger",
        json={"campaign_id": tenant.plain, "messages": [{"user_id": u} for _, u in HOSTILE]},
        headers=tenant.auth(),
    )
    assert created.status_code == 200, created.text
    request_id = created.json()["request_id"]
    sent = datetime.now(UTC)
    with session_scope() as session:  # the outcomes a delivery records
        session.add_all(
            Outcome(
                request_id=request_id,
                row_no=row_no,
                app_id=app.app_id,
                user_id=user_id,
                device_id=device_id,
                channel=Channel.push,
                sent_at=sent,
            )
            for row_no, (device_id, user_id) in enumerate(HOSTILE)
        )
    settings = get_settings()
    summary = _write_reports(
        settings=settings, request_id=request_id, campaign_id=tenant.plain, app_ids=[app.app_id]
    )
    [key] = summary.report_paths
    link = signed_url(settings=settings, path=f"/files/{key}")
    download = http.get(httpx.URL(link).raw_path.decode())  # this server, the link's path
    assert download.status_code == 200, download.text

    rows = list(csv.reader(io.StringIO(download.content.decode("utf-8"), newline="")))
    assert rows[0] == list(COLUMNS)
    assert len(rows) == 1 + len(HOSTILE)
    for row in rows:
        assert len(row) == len(COLUMNS), row
        for cell in row:
            assert not cell.startswith(FORMULA_STARTS), row
    shown = [(row[3], row[2]) for row in rows[1:]]
    kept = [
        tuple(v if not v.startswith((*FORMULA_STARTS, "\r", "\n")) else f"'{v}" for v in pair)
        for pair in HOSTILE
    ]
    assert shown == kept  # every value whole, a formula start behind a quote mark
    lines = download.content.replace(b'"dev\r\n-5+5"', b"").split(b"\n")
    assert lines[-1] == b""  # rows end with a line feed, as before
    assert not any(line.endswith(b"\r") for line in lines)


def _write_reports(**kwargs: Any) -> reports.ReportSummary:
    with session_scope() as session:
        return reports.write_reports(session=session, **kwargs)
