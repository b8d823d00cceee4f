"""Dry runs (``POST /api/campaigns/trigger?dry_run=true``, the client's ``preview``,
``send-batch`` with ``dry_run``) against the real stack: the HTTP API, a delivery worker
and the sandbox providers as subprocesses, on the session's Prefect server. A preview
answers exactly as a create of the same body would refuse it, and otherwise stores,
schedules and sends nothing — checked in the database, on the Prefect server, in
storage and at the sandbox — while a create of the same body is delivered once."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterTags,
)
from sqlmodel import col, func, select

from campaign_trigger.client import AsyncTriggerClient, BadRequest, TriggerClient
from campaign_trigger.config import get_settings
from campaign_trigger.flows import send_batch
from campaign_trigger.flows.send_batch import PREVIEW_ARTIFACT_KEY, Message, SendBatchInput
from campaign_trigger.services import admin, quota, requests
from campaign_trigger.services.housekeeping import request_of_key
from campaign_trigger.services.preview import PREVIEWS_DIR
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request
from integration.client.running_stack import (
    RunningStack,
    SeededTenant,
    eventually,
    running_stack,
    seed_tenant,
)
from support import ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRIGGER = "/api/campaigns/trigger"
CHUNK_SIZE = 2  # the stack's: a preview of a few messages reads several chunks
BAD_DRY_RUN = {"error_message": "dry_run must be true or false"}


@pytest.fixture(scope="module")
def stack(prefect_server: ManagedProcess, session_dir: Path) -> Iterator[RunningStack]:
    with running_stack(session_dir, extra_env={"CT_CHUNK_SIZE": str(CHUNK_SIZE)}) as s:
        yield s


@pytest.fixture
def tenant() -> SeededTenant:
    return seed_tenant()


@pytest.fixture
def auth(stack: RunningStack, tenant: SeededTenant) -> dict[str, str]:
    with TriggerClient(stack.api_url) as api:
        return {"Authorization": api.sign_in(tenant.member_email, tenant.password)}


def messages_for(users: list[str]) -> list[dict[str, Any]]:
    return [
        {"user_id": u, "template_variables": {"first_name": f"N{n}", "order_id": f"O{n}"}}
        for n, u in enumerate(users)
    ]


def csv_text(rows: list[tuple[str, str, str]], header: str = "User,first_name,order_id") -> bytes:
    out = io.StringIO()
    out.write(header + "\n")
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def stored_files() -> set[str]:
    """Every file in storage and in the previews' scratch folder but those of requests:
    a preview makes no request (``request_count``), and runs an earlier test left in
    this process may write their reports or remove their files meanwhile."""
    settings = get_settings()
    storage = Path(settings.storage_url)
    owner = {
        p: request_of_key(p.relative_to(storage).as_posix()) if p.is_relative_to(storage) else None
        for root in (storage, settings.home / PREVIEWS_DIR)
        if root.is_dir()
        for p in root.rglob("*")
        if p.is_file()
    }
    ids = {request_id for request_id in owner.values() if request_id}
    with session_scope() as session:
        known = set(session.exec(select(Request.id).where(col(Request.id).in_(ids))))
    return {str(p) for p, request_id in owner.items() if request_id not in known}  # None: no one's


def request_count(campaign_id: str) -> int:
    with session_scope() as session:
        return session.exec(
            select(func.count()).select_from(Request).where(col(Request.campaign_id) == campaign_id)
        ).one()


async def campaign_runs(campaign_id: str) -> int:
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"campaign:{campaign_id}"]))
        )
    return len(runs)


def sandbox_counts(stack: RunningStack, tokens: list[str]) -> dict[str, int]:
    per_token = httpx.get(f"{stack.sandbox_url}/sandbox/stats", timeout=10).json()["per_token"]
    return {token: per_token.get(token, 0) for token in tokens}


def quota_left(tenant: SeededTenant) -> int:
    with session_scope() as session:
        org_id = requests.campaign_owner(session=session, campaign_id=tenant.campaign_id)
        return quota.remaining(session=session, org_id=org_id)


def test_a_preview_shows_what_a_create_sends_and_stores_schedules_and_sends_nothing(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str]
) -> None:
    users = [*tenant.users, "nobody-without-device"]
    body = {"campaign_id": tenant.campaign_id, "messages": messages_for(users)}
    tokens = [f"ok-{u}" for u in tenant.users]
    files, quota_before = stored_files(), quota_left(tenant)

    response = httpx.post(f"{stack.api_url}{TRIGGER}?dry_run=true", json=body, headers=auth)

    assert response.status_code == 200, response.text
    preview = response.json()
    assert preview["dry_run"] is True
    assert (preview["campaign_id"], preview["channel"]) == (tenant.campaign_id, "push")
    assert (preview["message_count"], preview["users_without_device"]) == (4, 1)
    assert preview["apps"] == [
        {"app_id": tenant.app_id, "platform": "android", "devices": 3, "to_send": 3, "not_sent": {}}
    ]
    assert preview["devices_per_platform"] == {"android": 3}
    assert [m["row"] for m in preview["messages"]] == [1, 2, 3, 4]  # across chunks of 2
    first = preview["messages"][0]
    assert first["user_id"] == tenant.users[0]
    android = first["rendered"]["android"]
    assert (android["title"], android["body"]) == ("Hello N0", "Order O0 is on its way")
    assert android["payload"]["notification"] == {
        "title": "Hello N0",
        "body": "Order O0 is on its way",
    }
    assert android["payload"]["data"]["campaign_id"] == tenant.campaign_id
    assert "token" not in android["payload"]
    assert 0 < android["payload_bytes"] < 4096
    assert (preview["payload_error_count"], preview["payload_errors"]) == (0, [])

    assert quota_left(tenant) == quota_before - 1  # consumed like a create
    assert response.headers["X-Quota-Remaining"] == str(quota_before - 1)
    assert request_count(tenant.campaign_id) == 0
    assert stored_files() == files
    assert asyncio.run(campaign_runs(tenant.campaign_id)) == 0
    assert sandbox_counts(stack, tokens) == dict.fromkeys(tokens, 0)

    # The same body, created for real: accepted and delivered once per device; so the
    # preview before it sent nothing and scheduled no run.
    created = httpx.post(f"{stack.api_url}{TRIGGER}", json=body, headers=auth)
    assert created.status_code == 200, created.text
    request_id = created.json()["request_id"]

    def delivered() -> None:
        assert sandbox_counts(stack, tokens) == dict.fromkeys(tokens, 1)
        with session_scope() as session:
            request = session.get(Request, request_id)
            assert request is not None
            assert request.state.value == "processed"

    eventually(delivered, timeout=90)
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        assert request.message_count == preview["message_count"]
    assert request_count(tenant.campaign_id) == 1
    assert asyncio.run(campaign_runs(tenant.campaign_id)) == 1


def _json_cases(tenant: SeededTenant) -> list[tuple[str, dict[str, Any]]]:
    campaign = tenant.campaign_id
    good = messages_for(tenant.users)
    return [
        ("no campaign id", {"json": {"messages": good}}),
        ("unknown campaign", {"json": {"campaign_id": "no-such-campaign", "messages": good}}),
        (
            "missing variable",
            {
                "json": {
                    "campaign_id": campaign,
                    "messages": [{"user_id": "u1", "template_variables": {"first_name": "A"}}],
                }
            },
        ),
        (
            "past send_at",
            {
                "json": {
                    "campaign_id": campaign,
                    "send_at": "2020-01-01T00:00:00Z",
                    "messages": good,
                }
            },
        ),
        ("no messages", {"json": {"campaign_id": campaign, "messages": []}}),
        ("no user id", {"json": {"campaign_id": campaign, "messages": [{"user": "u1"}]}}),
        (
            "malformed JSON",
            {"content": b'{"campaign_id": ', "headers": {"Content-Type": "application/json"}},
        ),
        ("plain body", {"content": b"User\nu1\n", "headers": {"Content-Type": "text/csv"}}),
    ]


def _csv_cases(tenant: SeededTenant) -> list[tuple[str, dict[str, Any]]]:
    form = {"campaign_id": tenant.campaign_id}

    def upload(content: bytes, name: str = "batch.csv") -> dict[str, Any]:
        return {"data": form, "files": {"file": (name, content, "text/csv")}}

    return [
        ("no User column", upload(csv_text([("u1", "A", "B")], header="user,first_name,order_id"))),
        ("missing variable column", upload(csv_text([], header="User,first_name") + b"u1,A\n")),
        ("empty user", upload(csv_text([("", "A", "B")]))),
        ("header only", upload(csv_text([]))),
        ("unbalanced quote", upload(b'User,first_name,order_id\nu1,"A,B\n')),
        ("not a CSV", upload(b"%PDF-1.4 binary", name="batch.pdf")),
        (
            "both sources",
            {
                "data": {**form, "messages": "[]"},
                "files": {"file": ("b.csv", csv_text([("u1", "A", "B")]), "text/csv")},
            },
        ),
        (
            "unknown campaign",
            {**upload(csv_text([("u1", "A", "B")])), "data": {"campaign_id": "x"}},
        ),
    ]


def test_invalid_bodies_get_the_same_400_from_a_preview_as_from_a_create(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str]
) -> None:
    files = stored_files()
    cases = _json_cases(tenant) + _csv_cases(tenant)
    with httpx.Client(base_url=stack.api_url, headers=auth, timeout=30) as http:
        for name, call in cases:
            created = http.post(TRIGGER, **call)
            previewed = http.post(TRIGGER, params={"dry_run": "true"}, **call)
            assert created.status_code == 400, (name, created.text)
            assert (previewed.status_code, previewed.content) == (400, created.content), name
            assert created.json()["error_message"], name
    assert request_count(tenant.campaign_id) == 0
    assert stored_files() == files


@pytest.mark.parametrize("query", ["yes", "", "1", "0", "True", "FALSE", "true&dry_run=true"])
def test_a_dry_run_value_other_than_true_or_false_is_refused(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str], query: str
) -> None:
    body = {"campaign_id": tenant.campaign_id, "messages": messages_for(tenant.users)}
    response = httpx.post(f"{stack.api_url}{TRIGGER}?dry_run={query}", json=body, headers=auth)
    assert (response.status_code, response.json()) == (400, BAD_DRY_RUN)
    assert request_count(tenant.campaign_id) == 0


def test_dry_run_false_creates_the_request(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str]
) -> None:
    body = {
        "campaign_id": tenant.campaign_id,
        "send_at": "2099-01-01T00:00:00Z",
        "messages": messages_for(tenant.users),
    }
    response = httpx.post(f"{stack.api_url}{TRIGGER}?dry_run=false", json=body, headers=auth)
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"request_id"}
    assert request_count(tenant.campaign_id) == 1


def test_a_csv_preview_reports_payloads_over_4_kb_and_leaves_no_file(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str]
) -> None:
    rows = [(u, f"N{n}", f"O{n}") for n, u in enumerate(tenant.users)]
    rows.append(("nobody", "Big", "x" * 5000))  # row 5 (the header is 1): over 4 KB
    rows.append(("nobody-2", "Small", "O5"))
    files = stored_files()
    response = httpx.post(
        f"{stack.api_url}{TRIGGER}?dry_run=true",
        data={"campaign_id": tenant.campaign_id},
        files={"file": ("batch.csv", csv_text(rows), "text/csv")},
        headers=auth,
    )
    assert response.status_code == 200, response.text
    preview = response.json()
    assert (preview["message_count"], preview["users_without_device"]) == (5, 2)
    assert preview["payload_error_count"] == 1
    [problem] = preview["payload_errors"]
    assert (problem["row"], problem["user_id"], problem["platform"]) == (5, "nobody", "android")
    assert problem["error"].startswith("FPErrJSONMarshalling: payload is ")
    assert "over 4096" in problem["error"]
    big = preview["messages"][3]["rendered"]["android"]
    assert (big["payload"], big["error"]) == (None, problem["error"])
    assert preview["messages"][4]["rendered"]["android"]["title"] == "Hello Small"
    assert stored_files() == files  # the upload and its message file are gone
    assert request_count(tenant.campaign_id) == 0


def test_the_clients_preview_returns_a_typed_preview_and_raises_as_create(
    stack: RunningStack, tenant: SeededTenant, tmp_path: Path
) -> None:
    batch = tmp_path / "batch.csv"
    batch.write_bytes(csv_text([(u, "A", "B") for u in tenant.users]))
    with TriggerClient(stack.api_url) as api:
        api.sign_in(tenant.member_email, tenant.password)
        preview = api.preview(tenant.campaign_id, messages=messages_for(tenant.users))
        assert (preview.message_count, preview.apps[0].to_send) == (3, 3)
        assert preview.messages[0].rendered["android"].title == "Hello N0"
        assert api.preview(tenant.campaign_id, csv_path=batch).message_count == 3
        with pytest.raises(BadRequest) as refused:
            api.preview("no-such-campaign", messages=messages_for(tenant.users))
        assert refused.value.error_message == "Unknown campaign with identifier no-such-campaign"

    async def preview_async() -> int:
        async with AsyncTriggerClient(stack.api_url) as api:
            await api.sign_in(tenant.member_email, tenant.password)
            preview = await api.preview(tenant.campaign_id, csv_path=batch)
            return preview.devices_per_platform["android"]

    assert asyncio.run(preview_async()) == 3
    assert request_count(tenant.campaign_id) == 0


def test_send_batch_dry_run_shows_the_preview_as_a_markdown_artifact(
    stack: RunningStack, tenant: SeededTenant
) -> None:
    storage = Path(get_settings().storage_url)
    source = storage / "incoming" / f"{tenant.campaign_id}.csv"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(csv_text([(u, f"N{n}", f"O{n}") for n, u in enumerate(tenant.users)]))
    files, quota_before = stored_files(), quota_left(tenant)
    batch = SendBatchInput(
        campaign_id=tenant.campaign_id, csv_path=f"incoming/{tenant.campaign_id}.csv"
    )

    state = send_batch(batch, dry_run=True, return_state=True)

    result = state.result()
    assert result.request_id is None
    assert result.preview is not None
    assert result.preview.message_count == 3
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    markdown = asyncio.run(preview_artifact(run_id))
    assert f"# Dry run of campaign `{tenant.campaign_id}`" in markdown
    assert "| messages | 3 |" in markdown
    assert f"| `{tenant.app_id}` | android | 3 | 3 | — |" in markdown
    assert "| 2 | android | Hello N0 | Order O0 is on its way |" in markdown  # header: 1
    assert tenant.users[0] not in markdown
    assert quota_left(tenant) == quota_before - 1
    assert stored_files() == files
    assert request_count(tenant.campaign_id) == 0
    assert asyncio.run(campaign_runs(tenant.campaign_id)) == 0

    json_batch = SendBatchInput(
        campaign_id=tenant.campaign_id,
        messages=[Message.model_validate(m) for m in messages_for(tenant.users[:1])],
    )
    json_preview = send_batch(json_batch, dry_run=True).preview
    assert json_preview is not None
    assert json_preview.message_count == 1


async def preview_artifact(flow_run_id: UUID) -> str:
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    [artifact] = [a for a in artifacts if a.key == PREVIEW_ARTIFACT_KEY]
    assert artifact.type == "markdown"
    return str(artifact.data)


def test_an_inapp_preview_renders_for_the_inbox_without_provider_payloads(
    stack: RunningStack, tenant: SeededTenant, auth: dict[str, str]
) -> None:
    with session_scope() as session:
        campaign = admin.create_campaign(
            session=session,
            org_name=tenant.org,
            app_ids=[tenant.app_id],
            channel="inapp",
            title="In {{ first_name }}",
            body="Order {{ order_id }}",
        )
        admin.launch_campaign(session=session, campaign_id=campaign.id)
        campaign_id = campaign.id
    messages = messages_for(tenant.users[:1])
    messages[0]["template_variables"]["order_id"] = "x" * 5000  # no provider limit in-app
    response = httpx.post(
        f"{stack.api_url}{TRIGGER}?dry_run=true",
        json={"campaign_id": campaign_id, "messages": messages},
        headers=auth,
    )
    assert response.status_code == 200, response.text
    preview = response.json()
    assert preview["channel"] == "inapp"
    assert preview["messages"][0]["rendered"] == {
        "inapp": {
            "title": "In N0",
            "body": "Order " + "x" * 5000,
            "payload": None,
            "payload_bytes": None,
            "error": None,
        }
    }
    assert preview["payload_error_count"] == 0
    assert request_count(campaign_id) == 0
