"""Creating, cancelling, listing and reporting requests: the happy paths and the bodies,
idempotency, limits, signed links, and error bodies for malformed calls (in process)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from api_tenants import Tenant
from sqlmodel import col, select

from campaign_trigger.config import get_settings
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage, report_key, upload_key
from campaign_trigger.store.models import (
    MessageSource,
    Request,
    RequestMessage,
    RequestState,
)

TRIGGER = "/api/campaigns/trigger"
CSV = b"User,first_name,code,extra\nu1,Ann,A1,x\nu2,Bob,B2,y\nu3,\xc3\x89lise,C3,z\n"


def _later(hours: int = 1) -> datetime:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(microsecond=0)


def _messages(n: int) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{i}", "template_variables": {"first_name": f"N{i}", "code": str(i)}}
        for i in range(n)
    ]


def _row(request_id: str) -> Request:
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        return request


async def _local_get(client: httpx.AsyncClient, link: str) -> httpx.Response:
    parts = urlsplit(link)
    return await client.get(f"{parts.path}?{parts.query}")


async def test_json_request_is_stored_scheduled_in_the_outbox(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    send_at = _later()
    body = {
        "campaign_id": tenant.started,
        "send_at": send_at.strftime("%Y%m%dT%H%M%S%z"),
        "messages": _messages(3),
    }
    response = await client.post(TRIGGER, json=body, headers=tenant.auth())
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"request_id"}
    request = _row(response.json()["request_id"])
    assert (request.state, request.flow_run_id, request.source) == (
        RequestState.scheduled,
        None,
        MessageSource.json,
    )
    assert request.send_at == send_at
    assert request.message_count == 3
    with session_scope() as session:
        rows = session.exec(
            select(RequestMessage)
            .where(RequestMessage.request_id == request.id)
            .order_by(col(RequestMessage.seq))
        ).all()
        assert [(r.user_id, r.template_variables) for r in rows] == [
            (m["user_id"], m["template_variables"]) for m in _messages(3)
        ]


async def test_csv_request_keeps_the_uploaded_file(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={
            "campaign_id": (None, tenant.started),
            "send_at": (None, _later(3).strftime("%Y-%m-%dT%H:%M:%S+02:00")),
            "file": ("users.csv", CSV, "text/csv"),
        },
    )
    assert response.status_code == 200, response.text
    request = _row(response.json()["request_id"])
    assert request.source == MessageSource.csv
    assert request.message_count == 3
    assert request.messages_path == upload_key(request.id)
    with get_storage(get_settings()).open(upload_key(request.id)) as handle:
        assert handle.read() == CSV


async def test_csv_without_campaign_variables_needs_only_user(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={
            "campaign_id": (None, tenant.plain),
            "file": ("u.csv", b"User\r\nu1\r\nu2\r\n", None),
        },
    )
    assert response.status_code == 200, response.text
    assert _row(response.json()["request_id"]).message_count == 2


async def test_csv_with_an_empty_user_is_refused(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={"campaign_id": (None, tenant.plain), "file": ("u.csv", b'User\nu1\n""\nu3\n', None)},
    )
    assert response.status_code == 400
    assert response.json() == {"error_message": "Invalid file : empty 'User' value on row 3"}


async def test_refused_upload_leaves_no_file(client: httpx.AsyncClient, tenant: Tenant) -> None:
    storage = get_storage(get_settings())
    before = set(storage.fs.ls(storage.path("uploads"))) if storage.exists("uploads") else set()
    response = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={"campaign_id": (None, tenant.started), "file": ("u.csv", b"User\nu1\n", "text/csv")},
    )
    assert response.status_code == 400
    after = set(storage.fs.ls(storage.path("uploads"))) if storage.exists("uploads") else set()
    assert after == before


async def test_json_cap_points_to_the_csv_method(client: httpx.AsyncClient, tenant: Tenant) -> None:
    cap = get_settings().json_messages_cap
    ok = await client.post(
        TRIGGER,
        json={"campaign_id": tenant.started, "messages": _messages(cap)},
        headers=tenant.auth(),
    )
    assert ok.status_code == 200, ok.text
    response = await client.post(
        TRIGGER,
        json={"campaign_id": tenant.started, "messages": _messages(cap + 1)},
        headers=tenant.auth(),
    )
    assert response.status_code == 400
    assert response.json() == {
        "error_message": (
            f"Too many messages: at most {cap} per JSON call ({cap + 1} given); send them as a "
            "CSV file (multipart/form-data, form key 'file')"
        )
    }


async def test_same_idempotency_key_and_body_returns_the_first_request(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = {"campaign_id": tenant.started, "messages": _messages(2)}
    headers = {**tenant.auth(), "Idempotency-Key": "order-42"}
    first = await client.post(TRIGGER, json=body, headers=headers)
    again = await client.post(TRIGGER, json=body, headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    with session_scope() as session:
        assert (
            len(
                session.exec(
                    select(Request).where(
                        Request.org_id == tenant.org_id, Request.idempotency_key == "order-42"
                    )
                ).all()
            )
            == 1
        )
    changed = await client.post(TRIGGER, json={**body, "messages": _messages(3)}, headers=headers)
    assert changed.status_code == 409
    assert changed.json() == {
        "error_message": (
            "This Idempotency-Key was already used with a different request body; use a new key "
            "for a new request"
        )
    }


async def test_idempotency_for_csv_uploads(client: httpx.AsyncClient, tenant: Tenant) -> None:
    headers = {**tenant.auth(), "Idempotency-Key": "csv-1"}

    async def send(content: bytes) -> httpx.Response:
        return await client.post(
            TRIGGER,
            headers=headers,
            files={"campaign_id": (None, tenant.started), "file": ("u.csv", content, "text/csv")},
        )

    first, again = await send(CSV), await send(CSV)
    assert first.json() == again.json()
    assert (await send(CSV + b"u4,D,D4,w\n")).status_code == 409


@pytest.mark.parametrize(("key", "method"), [("", "json"), ("  ", "json"), ("", "csv")])
async def test_a_blank_idempotency_key_is_no_key(
    client: httpx.AsyncClient, tenant: Tenant, key: str, method: str
) -> None:
    """A blank key replays nothing: each call with it creates its own request."""
    headers = {**tenant.auth(), "Idempotency-Key": key}

    async def send(users: int) -> httpx.Response:
        if method == "json":
            body = {"campaign_id": tenant.started, "messages": _messages(users)}
            return await client.post(TRIGGER, json=body, headers=headers)
        rows = "".join(f"u{i},N{i},{i},x\n" for i in range(users))
        content = f"User,first_name,code,extra\n{rows}".encode()
        return await client.post(
            TRIGGER,
            headers=headers,
            files={"campaign_id": (None, tenant.started), "file": ("u.csv", content, "text/csv")},
        )

    first, second = await send(1), await send(2)
    assert first.status_code == second.status_code == 200, second.text
    assert first.json() != second.json()
    for response, users in ((first, 1), (second, 2)):
        row = _row(response.json()["request_id"])
        assert (row.message_count, row.idempotency_key, row.body_hash) == (users, None, None)


async def test_idempotency_key_is_per_organisation(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    mine = await client.post(
        TRIGGER,
        json={"campaign_id": tenant.started, "messages": _messages(1)},
        headers={**tenant.auth(), "Idempotency-Key": "shared"},
    )
    theirs = await client.post(
        TRIGGER,
        json={"campaign_id": other_tenant.started, "messages": _messages(1)},
        headers={**other_tenant.auth(), "Idempotency-Key": "shared"},
    )
    assert mine.status_code == theirs.status_code == 200
    assert mine.json() != theirs.json()


async def test_cancel_answers_the_request_as_created(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    send_at = _later(3)
    created = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        json={
            "campaign_id": tenant.started,
            "send_at": send_at.isoformat(),
            "messages": [{"user_id": "u1", "template_variables": {"first_name": "A", "code": "1"}}],
        },
    )
    request_id = created.json()["request_id"]
    response = await client.put(
        f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body == {
        "request_id": request_id,
        "campaign_id": tenant.started,
        "requested_at": body["requested_at"],
        "to_be_send_at": int(send_at.timestamp()),
        "messages": [{"user_id": "u1", "template_variables": {"first_name": "A", "code": "1"}}],
    }
    assert abs(body["requested_at"] - time.time()) < 60
    assert _row(request_id).state == RequestState.canceled


async def test_cancel_of_a_csv_request_links_to_its_file(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    created = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={
            "campaign_id": (None, tenant.started),
            "send_at": (None, _later().isoformat()),
            "file": ("u.csv", CSV, "text/csv"),
        },
    )
    request_id = created.json()["request_id"]
    response = await client.put(
        f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
    )
    link = response.json()["messages"]
    assert isinstance(link, str)
    assert link.startswith(f"{get_settings().public_base_url}/files/uploads/{request_id}.csv?")
    download = await _local_get(client, link)
    assert download.status_code == 200
    assert download.content == CSV
    assert download.headers["content-type"].startswith("text/csv")


async def test_signed_links_refuse_tampering_and_expiry(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    settings = get_settings()
    storage = get_storage(settings)
    key = report_key("r-links", "app")
    with storage.open(key, "wb") as handle:
        handle.write(b"app_id\n")
    good = signed_url(settings=settings, path=f"/files/{key}")
    assert (await _local_get(client, good)).status_code == 200
    query = parse_qs(urlsplit(good).query)
    expires, signature = query["expires"][0], query["signature"][0]
    bad = [
        f"/files/{key}?expires={expires}&signature={'0' * 64}",
        f"/files/{key}?expires={int(expires) + 1}&signature={signature}",
        f"/files/{report_key('r-other', 'app')}?expires={expires}&signature={signature}",
        urlsplit(signed_url(settings=settings, path=f"/files/{key}", now=time.time() - 7200)).path
        + "?"
        + urlsplit(
            signed_url(settings=settings, path=f"/files/{key}", now=time.time() - 7200)
        ).query,
    ]
    for url in bad:
        response = await client.get(url)
        assert response.status_code == 403, url
        assert response.json() == {"error_message": "This link is invalid or has expired"}
    missing = await client.get(f"/files/{key}")
    assert missing.status_code == 400
    assert set(missing.json()) == {"error_message"}


async def test_scheduled_list_pages_with_a_total(client: httpx.AsyncClient, tenant: Tenant) -> None:
    ids = []
    for hours in (3, 1, 2):
        created = await client.post(
            TRIGGER,
            headers=tenant.auth(),
            json={
                "campaign_id": tenant.started,
                "send_at": _later(hours).isoformat(),
                "messages": _messages(1),
            },
        )
        ids.append((hours, created.json()["request_id"]))
    ordered = [rid for _, rid in sorted(ids)]
    url = f"/api/campaigns/{tenant.started}/request/scheduled"
    first = await client.get(url, params={"limit": 2}, headers=tenant.auth())
    assert first.status_code == 200
    assert first.headers["x-total-count"] == "3"
    body = first.json()
    assert body["campaign_id"] == tenant.started
    assert [r["request_id"] for r in body["requests"]] == ordered[:2]
    assert set(body["requests"][0]) == {"request_id", "requested_at", "to_be_send_at", "messages"}
    assert abs(body["requests"][0]["to_be_send_at"] - _later(1).timestamp()) < 30
    rest = await client.get(url, params={"limit": 2, "offset": 2}, headers=tenant.auth())
    assert [r["request_id"] for r in rest.json()["requests"]] == ordered[2:]
    for params in ({"limit": 0}, {"limit": 101}, {"offset": -1}, {"limit": "ten"}):
        bad = await client.get(url, params=params, headers=tenant.auth())
        assert bad.status_code == 400
        assert set(bad.json()) == {"error_message"}


async def test_report_links_download_the_report_files(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    created = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        json={"campaign_id": tenant.started, "messages": _messages(1)},
    )
    request_id = created.json()["request_id"]
    storage = get_storage(get_settings())
    key = report_key(request_id, "app-x")
    content = b"app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,error_message\n"
    with storage.open(key, "wb") as handle:
        handle.write(content)
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        request.state = RequestState.processed
        request.report_paths = [key]
        request.flow_run_id = "00000000-0000-0000-0000-000000000001"  # unknown to Prefect
        session.add(request)
    response = await client.get(
        "/api/campaigns/report", params={"request_id": request_id}, headers=tenant.auth()
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["request_id"] == request_id
    assert len(body["reports"]) == 1
    assert (await _local_get(client, body["reports"][0])).content == content


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (CSV, "text/csv"),
        (CSV, "application/octet-stream"),
        (CSV, None),
        (b"campaign_id=x", "application/x-www-form-urlencoded"),
    ],
)
async def test_a_plain_body_is_refused_clearly(
    client: httpx.AsyncClient, tenant: Tenant, content: bytes, content_type: str | None
) -> None:
    headers = {**tenant.auth(), **({"Content-Type": content_type} if content_type else {})}
    response = await client.post(TRIGGER, content=content, headers=headers)
    assert response.status_code == 400
    assert response.json() == {
        "error_message": (
            "The CSV file must be attached as multipart/form-data under the form key 'file' (a "
            "plain request body is not accepted); JSON messages need Content-Type: "
            "application/json"
        )
    }


async def test_a_file_under_another_key_is_explained(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        files={"campaign_id": (None, tenant.started), "csv": ("u.csv", CSV, "text/csv")},
    )
    assert response.status_code == 400
    # The contract's text, byte for byte; the form key is named in the API's docs.
    assert response.json() == {"error_message": "Must provide JSON messages or a CSV file"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{", "Malformed JSON body"),
        (b"", "Malformed JSON body"),
        (b"[1, 2]", "The JSON body must be an object"),
        (b'"x"', "The JSON body must be an object"),
        (b"\xff\xfe", "Malformed JSON body"),
    ],
)
async def test_malformed_json_is_a_400(
    client: httpx.AsyncClient, tenant: Tenant, content: bytes, message: str
) -> None:
    response = await client.post(
        TRIGGER, content=content, headers={**tenant.auth(), "Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json() == {"error_message": message}
    assert response.headers["x-quota-remaining"].isdigit()


async def test_broken_multipart_is_a_400(client: httpx.AsyncClient, tenant: Tenant) -> None:
    for content_type, content in [
        ("multipart/form-data", b"--x\r\n"),
        (
            "multipart/form-data; boundary=xyz",
            b"--xyz\r\nContent-Disposition: form-data; "
            b'name="file"; filename="u.csv"\r\n\r\nUser\nu1\n',
        ),
        ("multipart/form-data; boundary=xyz", b"garbage"),
    ]:
        response = await client.post(
            TRIGGER, content=content, headers={**tenant.auth(), "Content-Type": content_type}
        )
        assert response.status_code == 400, content
        assert response.json()["error_message"].startswith("Malformed multipart/form-data body")


async def test_unknown_routes_and_methods_answer_json(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    missing = await client.get("/api/nothing-here")
    assert (missing.status_code, missing.json()) == (404, {"error_message": "Not found"})
    wrong = await client.get(TRIGGER, headers=tenant.auth())
    assert (wrong.status_code, wrong.json()) == (405, {"error_message": "Method not allowed"})
    wrong = await client.delete("/users/sign_in")
    assert wrong.status_code == 405


async def test_the_openapi_page_documents_every_route(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    for path, method in [
        ("/users/sign_in", "post"),
        ("/users/sign_in.json", "post"),
        ("/users/sign_out", "delete"),
        ("/api/campaigns/trigger", "post"),
        ("/api/campaigns/request/{request_id}/cancel", "put"),
        ("/api/campaigns/{campaign_id}/request/scheduled", "get"),
        ("/api/campaigns/report", "get"),
        ("/files/{key}", "get"),
    ]:
        operation = paths[path][method]
        assert operation["description"] or operation["summary"]
        assert "422" not in operation["responses"]
        errors = {code: r for code, r in operation["responses"].items() if code >= "400"}
        assert errors, path
        for response in errors.values():
            assert response["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }
    body = paths["/api/campaigns/trigger"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert (await client.get("/docs")).status_code == 200
    assert json.dumps(schema)  # serialisable


async def test_form_parts_with_non_latin_names_are_handled(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    boundary = "b0undary"
    content = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="ñ名"\r\n\r\nx\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="campaign_id"\r\n\r\n'
        f"{tenant.plain}\r\n"
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="é.csv"\r\n'
        f"Content-Type: text/csv\r\n\r\nUser\nu1\r\n--{boundary}--\r\n"
    ).encode()
    response = await client.post(
        TRIGGER,
        content=content,
        headers={**tenant.auth(), "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert response.status_code == 200, response.text


async def test_an_unreachable_scheduler_is_a_503(client: httpx.AsyncClient, tenant: Tenant) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from support import free_port

    created = await client.post(
        TRIGGER,
        headers=tenant.auth(),
        json={
            "campaign_id": tenant.started,
            "send_at": _later().isoformat(),
            "messages": _messages(1),
        },
    )
    request_id = created.json()["request_id"]
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        request.flow_run_id = "00000000-0000-0000-0000-000000000002"
        session.add(request)
    closed = f"http://127.0.0.1:{free_port()}/api"
    with temporary_settings({PREFECT_API_URL: closed}):
        response = await client.put(
            f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth()
        )
    assert response.status_code == 503
    assert response.json() == {
        "error_message": "The scheduler (Prefect) cannot be reached right now; please retry"
    }
    assert response.headers["retry-after"] == "5"
