"""A request goes through outbox -> flow run -> worker -> sandbox -> report."""

from __future__ import annotations

from datetime import UTC, datetime

from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.models import RequestState
from e2e.delivery_support import (
    add_devices,
    add_request,
    every_outcome_audience,
    load_request,
    read_report,
    seed_tenant,
    state_name,
    wait_for_state,
)

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
