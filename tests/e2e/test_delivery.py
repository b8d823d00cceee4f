"""End to end: outbox -> Prefect server -> worker process -> sandbox -> report files."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import DeliveredChunk, Outcome
from e2e.conftest import Sandbox, WorkerFactory
from e2e.delivery_support import (
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
    await asyncio.sleep(max(0.0, (send_at - datetime.now(UTC)).total_seconds() - 2))
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
    assert delivered[next(d.token for d in audience.devices if "flaky" in d.device_id)] == 1
    assert sum(delivered.values()) == 3  # ok x2 and flaky, each exactly once


def _recorded(request_id: str) -> tuple[int, int]:
    with session_scope() as session:
        chunks = session.execute(
            select(func.count())
            .select_from(DeliveredChunk)
            .where(DeliveredChunk.request_id == request_id)
        ).scalar_one()
        rows = session.execute(
            select(func.count()).select_from(Outcome).where(Outcome.request_id == request_id)
        ).scalar_one()
    return int(chunks), int(rows)


async def test_a_worker_killed_mid_delivery_is_resumed_without_duplicates(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    env = {"CT_CHUNK_SIZE": "25"}
    worker = start_worker(**env)
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=600, prefix=f"kill-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    tokens = [d.token for d in audience.devices if d.token]
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
    notify_new_request(request_id)
    await wait_for_state(request_id, "RUNNING", timeout=30)

    # Kill at a consistent cut: some chunks recorded, every accepted message recorded.
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "no point to kill the worker at"
        before = sum(sandbox.delivered(tokens).values())
        chunks, rows = _recorded(request_id)
        after = sum(sandbox.delivered(tokens).values())
        if chunks >= 3 and before == after == rows and rows < len(tokens):
            worker.kill()
            break
        await asyncio.sleep(0.002)
    run = await read_run(request_id)
    assert run is not None
    assert run.state is not None
    assert run.state.type.value in ("RUNNING", "PENDING")  # left behind by the dead worker

    start_worker(**env)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    counts = sandbox.delivered(tokens)
    assert [t for t, n in counts.items() if n != 1] == []
    rows_per_app = {app: len(rows) for app, rows in read_report(request_id).items()}
    assert rows_per_app == {tenant.android: 600, tenant.ios: 600}


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
