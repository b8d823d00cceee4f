"""A request goes through outbox -> flow run -> worker -> sandbox -> report."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterType,
)
from sqlmodel import select

from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import DeliveredChunk, RequestState
from delivery_support import (
    add_csv_request,
    add_devices,
    add_request,
    bulk_audience,
    every_outcome_audience,
    load_request,
    read_report,
    seed_tenant,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]

COLUMNS = [
    "app_id",
    "campaign_id",
    "user_id",
    "device_id",
    "sent_at",
    "request_id",
    "channel",
    "error_message",
]


async def test_a_send_now_request_is_delivered_with_every_outcome(worker: None) -> None:
    tenant = seed_tenant()
    audience = every_outcome_audience(tenant)
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
    notify_new_request(request_id)

    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    assert run.name == request_id
    assert {f"campaign:{tenant.campaign_id}", f"org:{tenant.org_id}"} <= set(run.tags)
    request = load_request(request_id)
    assert request.state == RequestState.processed
    reports = read_report(request_id)
    assert set(reports) == set(tenant.app_ids)
    outcomes = {
        (r["user_id"].split("-")[1], r["app_id"][:3]): r["error_message"]
        for rows in reports.values()
        for r in rows
    }
    assert outcomes[("ok", "and")] == ""
    assert outcomes[("ok", "ios")] == ""
    assert outcomes[("flaky", "and")] == ""
    assert outcomes[("unreg", "and")] == "FPErrTokenUnregistered"
    assert outcomes[("expired", "ios")] == "FPErrBadRecipientToken"
    assert outcomes[("invalid", "and")] == "FPErrBadRecipientToken"
    assert outcomes[("fail", "and")] == "FPErrPushFailed"
    assert outcomes[("optout", "and")] == "Opt out"
    assert outcomes[("loggedout", "ios")] == "Last user not logged in"
    assert outcomes[("gone", "and")] == "App uninstalled"
    assert outcomes[("nodevice", "and")] == "No device for user"
    assert outcomes[("nodevice", "ios")] == "No device for user"
    for rows in reports.values():
        assert list(rows[0]) == COLUMNS
        for row in rows:
            assert (row["sent_at"] != "") == (row["error_message"] == "")
            assert row["request_id"] == request_id
            assert row["channel"] == "push"

    # The token that came back unregistered is now known: the next send does not push it.
    unreg_user = next(u for u in audience.users if u.startswith("u-unreg-"))
    again = add_request(tenant, [unreg_user], send_at=datetime.now(UTC))
    notify_new_request(again)
    run = await wait_for_state(again, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    rows = read_report(again)[tenant.android]
    assert [r["error_message"] for r in rows] == ["App uninstalled"]


async def test_a_csv_request_is_rendered_per_row_and_chunked(
    worker: None, sandbox_url: str
) -> None:
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=7, prefix=f"csv-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    rows = [
        {"User": u, "first_name": f"Ann{n}", "order_id": f"O-{n}"}
        for n, u in enumerate(audience.users)
    ]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC), chunk_size=3)
    notify_new_request(request_id)

    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)

    assert state_name(run) == "COMPLETED", run.state
    with session_scope() as session:
        chunks = session.exec(
            select(DeliveredChunk.chunk_no).where(DeliveredChunk.request_id == request_id)
        ).all()
    assert sorted(chunks) == [0, 1, 2]
    for n, user in enumerate(audience.users):
        delivered = httpx.get(
            f"{sandbox_url}/sandbox/deliveries", params={"token": f"{user}-ta"}
        ).json()
        assert len(delivered) == 1
        assert f"Hello Ann{n}" in str(delivered)
        assert f"Order O-{n} is on its way" in str(delivered)
    report = read_report(request_id)
    assert [r["user_id"] for r in report[tenant.android]] == audience.users

    # The UI's progress bar of a multi-chunk run ends full, whatever order updates landed.
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                type=ArtifactFilterType(any_=["progress"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]),
            )
        )
    assert [(a.data, a.description) for a in artifacts] == [(100.0, "Chunks delivered (3/3)")]
