"""Every error of the spec (section 7): status 400 and the exact body, for the JSON and
the CSV method wherever both apply. In-process client (ASGI), real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from api_tenants import Tenant
from sqlmodel import select

from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request, RequestState

pytestmark = pytest.mark.asyncio

TRIGGER = "/api/campaigns/trigger"
GOOD_CSV = b"User,first_name,code\nu1,Ann,A1\nu2,Bob,B2\n"
GOOD_MESSAGES = [{"user_id": "u1", "template_variables": {"first_name": "Ann", "code": "A1"}}]


def _error(response: httpx.Response, message: str, status: int = 400) -> None:
    assert response.status_code == status, response.text
    assert response.json() == {"error_message": message}


async def _json(client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any]) -> httpx.Response:
    return await client.post(TRIGGER, json=body, headers=tenant.auth())


async def _csv(
    client: httpx.AsyncClient,
    tenant: Tenant,
    fields: list[tuple[str, str]],
    content: bytes | None = GOOD_CSV,
    filename: str = "users.csv",
    content_type: str = "text/csv",
) -> httpx.Response:
    parts: list[tuple[str, Any]] = [(name, (None, value)) for name, value in fields]
    if content is not None:
        parts.append(("file", (filename, content, content_type)))
    return await client.post(TRIGGER, files=parts, headers=tenant.auth())


# --- campaign identifier -------------------------------------------------------------


async def test_json_without_campaign_id(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(
        await _json(client, tenant, {"messages": GOOD_MESSAGES}),
        "You must provide a campaign identifier",
    )


async def test_json_with_null_campaign_id(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(
        await _json(client, tenant, {"campaign_id": None, "messages": GOOD_MESSAGES}),
        "You must provide a campaign identifier",
    )


async def test_csv_without_campaign_id(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(await _csv(client, tenant, []), "You must provide a campaign identifier")


@pytest.mark.parametrize("value", ["", "   ", "\t"])
async def test_json_with_blank_campaign_id(
    client: httpx.AsyncClient, tenant: Tenant, value: str
) -> None:
    _error(
        await _json(client, tenant, {"campaign_id": value, "messages": GOOD_MESSAGES}),
        "Empty campaign identifier",
    )


@pytest.mark.parametrize("value", ["", "   "])
async def test_csv_with_blank_campaign_id(
    client: httpx.AsyncClient, tenant: Tenant, value: str
) -> None:
    _error(await _csv(client, tenant, [("campaign_id", value)]), "Empty campaign identifier")


@pytest.mark.parametrize("value", [12, 1.5, True, ["abc"], {"id": "abc"}])
async def test_json_with_non_string_campaign_id(
    client: httpx.AsyncClient, tenant: Tenant, value: object
) -> None:
    _error(
        await _json(client, tenant, {"campaign_id": value, "messages": GOOD_MESSAGES}),
        "Campaign identifier must be a String",
    )


async def test_csv_with_repeated_campaign_id(client: httpx.AsyncClient, tenant: Tenant) -> None:
    fields = [("campaign_id", tenant.started), ("campaign_id", tenant.plain)]
    _error(await _csv(client, tenant, fields), "Campaign identifier must be a String")


async def test_csv_with_array_campaign_id(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(
        await _csv(client, tenant, [("campaign_id[]", tenant.started)]),
        "Campaign identifier must be a String",
    )


# --- campaign ------------------------------------------------------------------------


async def test_json_unknown_campaign(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(
        await _json(client, tenant, {"campaign_id": "nope-123", "messages": GOOD_MESSAGES}),
        "Unknown campaign with identifier nope-123",
    )


async def test_csv_unknown_campaign(client: httpx.AsyncClient, tenant: Tenant) -> None:
    _error(
        await _csv(client, tenant, [("campaign_id", "nope-123")]),
        "Unknown campaign with identifier nope-123",
    )


async def test_scheduled_list_of_unknown_campaign(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.get("/api/campaigns/nope-123/request/scheduled", headers=tenant.auth())
    _error(response, "Campaign with identifier nope-123 was not found")


@pytest.mark.parametrize("segment", ["%20", "%20%09%20", ""])
async def test_scheduled_list_of_a_blank_campaign_id(
    client: httpx.AsyncClient, tenant: Tenant, segment: str
) -> None:
    response = await client.get(
        f"/api/campaigns/{segment}/request/scheduled", headers=tenant.auth()
    )
    _error(response, "Empty campaign identifier")


@pytest.mark.parametrize("which", ["draft", "ended"])
async def test_json_campaign_not_ready(
    client: httpx.AsyncClient, tenant: Tenant, which: str
) -> None:
    campaign_id = getattr(tenant, which)
    body = {"campaign_id": campaign_id, "messages": GOOD_MESSAGES}
    _error(
        await _json(client, tenant, body), f"Campaign with identifier {campaign_id} is not ready"
    )


@pytest.mark.parametrize("which", ["draft", "ended"])
async def test_csv_campaign_not_ready(
    client: httpx.AsyncClient, tenant: Tenant, which: str
) -> None:
    campaign_id = getattr(tenant, which)
    _error(
        await _csv(client, tenant, [("campaign_id", campaign_id)]),
        f"Campaign with identifier {campaign_id} is not ready",
    )


# --- time ----------------------------------------------------------------------------

BAD_TIMES = [
    "tomorrow",
    "2030-01-01T10:00:00",
    "20300101T100000",
    "2030-01-01 10:00:00+00:00",
    "2030-13-01T10:00:00+00:00",
    "2030-01-01T25:00:00Z",
    "2030-01-01T10:00:00+25:00",
]


@pytest.mark.parametrize("value", [*BAD_TIMES, 1700000000, ["2030-01-01T10:00:00Z"]])
async def test_json_invalid_time(client: httpx.AsyncClient, tenant: Tenant, value: object) -> None:
    body = {"campaign_id": tenant.started, "send_at": value, "messages": GOOD_MESSAGES}
    _error(await _json(client, tenant, body), "Invalid time format")


@pytest.mark.parametrize("value", BAD_TIMES)
async def test_csv_invalid_time(client: httpx.AsyncClient, tenant: Tenant, value: str) -> None:
    fields = [("campaign_id", tenant.started), ("send_at", value)]
    _error(await _csv(client, tenant, fields), "Invalid time format")


def _ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S+00:00")


async def test_json_time_in_the_past(client: httpx.AsyncClient, tenant: Tenant) -> None:
    body = {"campaign_id": tenant.started, "send_at": _ago(6), "messages": GOOD_MESSAGES}
    _error(await _json(client, tenant, body), "The delivery time is in the past, please change it")


async def test_csv_time_in_the_past(client: httpx.AsyncClient, tenant: Tenant) -> None:
    fields = [("campaign_id", tenant.started), ("send_at", _ago(6))]
    _error(await _csv(client, tenant, fields), "The delivery time is in the past, please change it")


async def test_four_minutes_in_the_past_sends_now(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = {"campaign_id": tenant.started, "send_at": _ago(4), "messages": GOOD_MESSAGES}
    response = await _json(client, tenant, body)
    assert response.status_code == 200, response.text
    with session_scope() as session:
        request = session.get(Request, response.json()["request_id"])
        assert request is not None
        assert abs((request.send_at - datetime.now(UTC)).total_seconds()) < 30


# --- messages ------------------------------------------------------------------------


@pytest.mark.parametrize("body_extra", [{}, {"messages": None}, {"messages": []}])
async def test_json_without_messages(
    client: httpx.AsyncClient, tenant: Tenant, body_extra: dict[str, Any]
) -> None:
    _error(
        await _json(client, tenant, {"campaign_id": tenant.started, **body_extra}),
        "Must provide JSON messages or a CSV file",
    )


async def test_csv_form_without_file(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.post(
        TRIGGER, headers=tenant.auth(), files={"campaign_id": (None, tenant.started)}
    )
    _error(response, "Must provide JSON messages or a CSV file")


async def test_csv_form_with_file_and_messages(client: httpx.AsyncClient, tenant: Tenant) -> None:
    import json

    fields = [("campaign_id", tenant.started), ("messages", json.dumps(GOOD_MESSAGES))]
    _error(await _csv(client, tenant, fields), "Must provide either JSON messages or a CSV file")


async def test_json_with_messages_and_file(client: httpx.AsyncClient, tenant: Tenant) -> None:
    body = {"campaign_id": tenant.started, "messages": GOOD_MESSAGES, "file": "users.csv"}
    _error(await _json(client, tenant, body), "Must provide either JSON messages or a CSV file")


@pytest.mark.parametrize("file", ["users.csv", None])
async def test_json_with_a_file_member_and_no_messages(
    client: httpx.AsyncClient, tenant: Tenant, file: str | None
) -> None:
    """A JSON body cannot carry a file: its `file` member counts only against messages."""
    body = {"campaign_id": tenant.started, "file": file}
    _error(await _json(client, tenant, body), "Must provide JSON messages or a CSV file")


@pytest.mark.parametrize(
    ("second", "refused"),
    [
        (b'filename="more.csv"\r\nContent-Type: text/csv\r\n\r\n' + GOOD_CSV, True),
        (b'filename=""\r\nContent-Type: text/csv\r\n\r\n' + GOOD_CSV, True),
        (b'filename=""\r\nContent-Type: application/octet-stream\r\n\r\n', False),
    ],
)
async def test_csv_form_with_two_files(
    client: httpx.AsyncClient, tenant: Tenant, second: bytes, refused: bool
) -> None:
    """Exactly one CSV file: a second one under `file` is refused, not silently dropped;
    a browser's empty file input (no name, no bytes) is no file."""
    parts = [
        b'name="campaign_id"\r\n\r\n' + tenant.started.encode(),
        b'name="file"; filename="users.csv"\r\nContent-Type: text/csv\r\n\r\n' + GOOD_CSV,
        b'name="file"; ' + second,
    ]
    content = b"".join(b"--b0\r\nContent-Disposition: form-data; " + p + b"\r\n" for p in parts)
    response = await client.post(
        TRIGGER,
        content=content + b"--b0--\r\n",
        headers={**tenant.auth(), "Content-Type": "multipart/form-data; boundary=b0"},
    )
    if not refused:
        assert response.status_code == 200, response.text
        return
    _error(response, "Must provide either JSON messages or a CSV file")
    with session_scope() as session:
        assert session.exec(select(Request).where(Request.org_id == tenant.org_id)).all() == []


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)
XLSX = b"PK\x03\x04\x14\x00\x06\x00" + bytes(64)


@pytest.mark.parametrize(
    ("filename", "content", "content_type"),
    [
        ("users.xlsx", GOOD_CSV, "text/csv"),
        ("users.csv", PNG, "text/csv"),
        ("users.csv", XLSX, "application/octet-stream"),
        ("users.csv", b"%PDF-1.7\n" + GOOD_CSV, "text/csv"),
        ("users.csv", b'{"User": "u1"}\n', "text/csv"),
        ("users.csv", GOOD_CSV, "image/png"),
        ("users.csv", b"User,first_name,code\x00\x00\x00\x01\x02", "text/csv"),
    ],
)
async def test_csv_unsupported_format(
    client: httpx.AsyncClient, tenant: Tenant, filename: str, content: bytes, content_type: str
) -> None:
    response = await _csv(
        client,
        tenant,
        [("campaign_id", tenant.started)],
        content=content,
        filename=filename,
        content_type=content_type,
    )
    _error(response, "Unsupported file format - only csv files are supported")


async def test_csv_without_user_column(client: httpx.AsyncClient, tenant: Tenant) -> None:
    content = b"user_id,first_name,code\nu1,Ann,A1\n"
    _error(
        await _csv(client, tenant, [("campaign_id", tenant.started)], content=content),
        "Invalid file : 'User' column is missing",
    )


@pytest.mark.parametrize(
    "message",
    [
        {"template_variables": {"first_name": "Ann", "code": "A1"}},
        {"userId": "u1", "template_variables": {"first_name": "Ann", "code": "A1"}},
        {"user_id": None, "template_variables": {"first_name": "Ann", "code": "A1"}},
    ],
)
async def test_json_message_without_user_id(
    client: httpx.AsyncClient, tenant: Tenant, message: dict[str, Any]
) -> None:
    body = {"campaign_id": tenant.started, "messages": [*GOOD_MESSAGES, message]}
    _error(await _json(client, tenant, body), "Invalid messages : 'user_id' key is missing")


async def test_json_missing_variables(client: httpx.AsyncClient, tenant: Tenant) -> None:
    body = {
        "campaign_id": tenant.started,
        "messages": [
            {"user_id": "u1", "template_variables": {"first_name": "A"}},
            {"user_id": "u2"},
        ],
    }
    _error(
        await _json(client, tenant, body), "Invalid file : missing variables : (first_name, code)"
    )


async def test_json_one_missing_variable(client: httpx.AsyncClient, tenant: Tenant) -> None:
    body = {
        "campaign_id": tenant.started,
        "messages": [{"user_id": "u1", "template_variables": {"first_name": "A"}}],
    }
    _error(await _json(client, tenant, body), "Invalid file : missing variables : (code)")


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        (b"User", "(first_name, code)"),
        (b"User,code", "(first_name)"),
        (b"first_name,User", "(code)"),
    ],
)
async def test_csv_missing_variables(
    client: httpx.AsyncClient, tenant: Tenant, header: bytes, missing: str
) -> None:
    content = (
        header
        + b"\n"
        + b"\n".join(b",".join([b"x"] * (header.count(b",") + 1)) for _ in range(2))
        + b"\n"
    )
    _error(
        await _csv(client, tenant, [("campaign_id", tenant.started)], content=content),
        f"Invalid file : missing variables : {missing}",
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            b"User,first_name,code\nu1,Caf\xe9,A1\n",
            "In CSV column #1: Row #2: CSV conversion error to string: invalid UTF8 data",
        ),
        (
            b"User,first_name,code\nu1,Ann\nu2,Bob,B2\n",
            "CSV parse error: Row #2: Expected 3 columns, got 2",
        ),
        (
            b"User,first_name,code\nu1,Ann,A1,extra\n",
            "CSV parse error: Row #2: Expected 3 columns, got 4",
        ),
        (b'User,first_name,code\nu1,"Ann,A1\nu2,Bob,B2\n', None),
        (b"\xff\xfeU\x00s\x00", "the file is UTF-16 encoded; use UTF-8"),
        (b"", "the file is empty"),
    ],
)
async def test_csv_reading_errors(
    client: httpx.AsyncClient, tenant: Tenant, content: bytes, reason: str | None
) -> None:
    response = await _csv(client, tenant, [("campaign_id", tenant.started)], content=content)
    assert response.status_code == 400, response.text
    message = response.json()["error_message"]
    assert message.startswith("Error when reading CSV file: ")
    if reason is not None:
        assert message == f"Error when reading CSV file: {reason}"


# --- requests: cancel and report ------------------------------------------------------


async def _created(
    client: httpx.AsyncClient, tenant: Tenant, campaign_id: str | None = None
) -> str:
    body = {
        "campaign_id": campaign_id or tenant.started,
        "send_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="seconds"),
        "messages": GOOD_MESSAGES
        if campaign_id in (None, tenant.started)
        else [{"user_id": "u1", "template_variables": {"first_name": "A"}}],
    }
    response = await _json(client, tenant, body)
    assert response.status_code == 200, response.text
    return str(response.json()["request_id"])


async def test_cancel_unknown_request(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.put("/api/campaigns/request/nope-1/cancel", headers=tenant.auth())
    _error(response, "The request nope-1 was not found")


async def test_report_unknown_request(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.get(
        "/api/campaigns/report", params={"request_id": "nope-1"}, headers=tenant.auth()
    )
    _error(response, "The request nope-1 was not found")


@pytest.mark.parametrize("query", ["", "?request_id=", "?other=1", "?request_id=%20"])
async def test_report_without_request_id(
    client: httpx.AsyncClient, tenant: Tenant, query: str
) -> None:
    response = await client.get(f"/api/campaigns/report{query}", headers=tenant.auth())
    _error(response, "You must provide a request_id")


@pytest.mark.parametrize("segment", ["%20", "%20%09%20", ""])
async def test_cancel_without_request_id(
    client: httpx.AsyncClient, tenant: Tenant, segment: str
) -> None:
    response = await client.put(f"/api/campaigns/request/{segment}/cancel", headers=tenant.auth())
    _error(response, "You must provide a request_id")


@pytest.mark.parametrize(
    "query", ["?request_id=a&request_id=b", "?request_id[]=a", "?request_id[0]=a&request_id[1]=b"]
)
async def test_report_with_non_string_request_id(
    client: httpx.AsyncClient, tenant: Tenant, query: str
) -> None:
    response = await client.get(f"/api/campaigns/report{query}", headers=tenant.auth())
    _error(response, "Request identifier must be a String")


async def test_cancel_twice(client: httpx.AsyncClient, tenant: Tenant) -> None:
    request_id = await _created(client, tenant)
    first = await client.put(f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth())
    assert first.status_code == 200, first.text
    second = await client.put(f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth())
    _error(second, "Request already canceled")


def _set_state(request_id: str, state: RequestState, **values: Any) -> None:
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        request.state = state
        for name, value in values.items():
            setattr(request, name, value)
        session.add(request)


async def test_cancel_started_request(client: httpx.AsyncClient, tenant: Tenant) -> None:
    request_id = await _created(client, tenant)
    _set_state(request_id, RequestState.running)
    response = await client.put(
        f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
    )
    _error(response, "Request can't be canceled")


async def test_report_of_unprocessed_request(client: httpx.AsyncClient, tenant: Tenant) -> None:
    request_id = await _created(client, tenant)
    response = await client.get(
        "/api/campaigns/report", params={"request_id": request_id}, headers=tenant.auth()
    )
    _error(response, "Request not processed yet")


async def test_report_of_unpublished_inapp_request(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    request_id = await _created(client, tenant, tenant.inapp)
    # A flow run the Prefect server does not know: the mirror (processed) is believed,
    # and an in-app request without its report files is not published yet.
    _set_state(
        request_id, RequestState.processed, flow_run_id="00000000-0000-0000-0000-000000000000"
    )
    response = await client.get(
        "/api/campaigns/report", params={"request_id": request_id}, headers=tenant.auth()
    )
    _error(response, "Batches not published yet")
