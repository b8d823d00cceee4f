"""End to end: outbox -> Prefect server -> worker process -> sandbox -> report files."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    LogFilter,
    LogFilterFlowRunId,
)

from campaign_trigger.config import get_settings
from campaign_trigger.services.scheduling import notify_new_request
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    every_outcome_audience,
    read_report,
    read_run,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import Sandbox, WorkerFactory
from e2e.takeover_support import dead_run_states
from support import ManagedProcess, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXPECTED = {
    ("ok", "and"): "",
    ("ok", "ios"): "",
    ("flaky", "and"): "",
    ("unreg", "and"): "FPErrTokenUnregistered",
    ("expired", "ios"): "FPErrBadRecipientToken",
    ("invalid", "and"): "FPErrBadRecipientToken",
    ("fail", "and"): "FPErrPushFailed",
    ("optout", "and"): "Opt out",
    ("loggedout", "ios"): "Last user not logged in",
    ("gone", "and"): "App uninstalled",
    ("nodevice", "and"): "No device for user",
    ("nodevice", "ios"): "No device for user",
}


async def test_a_request_scheduled_ahead_stays_scheduled_then_is_delivered(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    start_worker()
    tenant = seed_tenant()
    audience = every_outcome_audience(tenant)
    add_devices(audience.devices)
    send_at = datetime.now(UTC) + timedelta(seconds=5)
    request_id = add_request(tenant, audience.users, send_at=send_at)
    notify_new_request(request_id)

    run = await wait_for_state(request_id, "SCHEDULED", timeout=4)
    # A worker claims a run scheduled ahead at most its prefetch (2 s) before its time.
    await asyncio.sleep(max(0.0, (send_at - datetime.now(UTC)).total_seconds() - 3))
    run = await read_run(request_id)  # type: ignore[assignment]
    assert run.state is not None
    assert run.state.type.value == "SCHEDULED"
    assert not any(sandbox.delivered([d.token for d in audience.devices if d.token]).values())

    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=60)
    assert state_name(run) == "COMPLETED", run.state
    reports = read_report(request_id)
    rows = [row for app_rows in reports.values() for row in app_rows]
    outcomes = {(r["user_id"].split("-")[1], r["app_id"][:3]): r["error_message"] for r in rows}
    assert outcomes == EXPECTED
    # One row per device; the user with no device at all once in each app's report.
    assert len(rows) == len(audience.devices) + 2
    for row in rows:
        if row["sent_at"]:
            assert datetime.fromisoformat(row["sent_at"]) >= send_at  # never before send_at
    delivered = sandbox.delivered([d.token for d in audience.devices if d.token])
    flaky = next(d.token for d in audience.devices if "flaky" in d.device_id)
    assert flaky is not None
    assert delivered[flaky] == 1
    assert sum(delivered.values()) == 3  # ok x2 and flaky, each exactly once
    # The run's logs reach the Prefect UI from the worker process (its own log set-up
    # keeps Prefect's handler of run logs).
    assert any(line.startswith("report: ") for line in await _run_logs(run.id, "report: "))


async def _run_logs(flow_run_id: uuid.UUID, awaited: str, timeout: float = 20) -> list[str]:
    """The run's log lines in Prefect, once one starts with ``awaited`` (they are posted
    in batches) or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while True:
            found = await client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
            lines = [log.message for log in found]
            if any(line.startswith(awaited) for line in lines) or time.monotonic() > deadline:
                return lines
            await asyncio.sleep(0.5)


async def test_a_request_accepted_while_prefect_is_down_is_delivered_once_it_is_back(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    deployed_server: ManagedProcess,
) -> None:
    start_worker()
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=5, prefix=f"down-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    deployed_server.stop()
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
        notify_new_request(request_id)  # the service call succeeds: the request is in the outbox
        await asyncio.sleep(2)
    finally:
        deployed_server.popen = deployed_server._spawn()
        wait_http(
            deployed_server.env["PREFECT_API_URL"] + "/health", timeout=90, process=deployed_server
        )
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    assert set(sandbox.delivered([d.token for d in audience.devices if d.token]).values()) == {1}


async def test_a_run_that_outlasts_the_dead_run_limit_keeps_its_worker(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """The worker sends its runs' heartbeats itself (not Prefect's engine: ``heartbeats.py``):
    a request that takes longer than ``CT_DEAD_RUN_AFTER_SECONDS`` is never marked dead
    nor taken over, and each device gets its message once. The sandbox answers each
    message after 1 s, one at a time: ``dead_after + 5`` Android devices take that many
    seconds (the iOS device of each user would double it, testing nothing more)."""
    dead_after = get_settings().dead_run_after_seconds
    start_worker(CT_DELIVERY_CONCURRENCY="1")
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=dead_after + 5, prefix=f"long-{uuid.uuid4().hex[:6]}")
    audience.devices = [d for d in audience.devices if d.app_id == tenant.android]
    add_devices(audience.devices)
    latency = sandbox.state.latency_ms
    sandbox.state.configure(latency_ms=1000)
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
        notify_new_request(request_id)
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=180)
    finally:
        sandbox.state.configure(latency_ms=latency)
    assert state_name(run) == "COMPLETED", run.state
    assert run.start_time is not None
    assert run.end_time is not None
    assert (run.end_time - run.start_time).total_seconds() > dead_after
    assert await dead_run_states(request_id) == 0
    assert set(sandbox.delivered([d.token for d in audience.devices if d.token]).values()) == {1}
