"""End to end: outbox -> Prefect server -> worker process -> sandbox -> report files."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prefect import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from sqlalchemy import func, select

from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import DeliveredChunk, Outcome
from delivery_support import (
    DeviceSpec,
    add_csv_request,
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


def _recorded(request_id: str) -> tuple[int, int]:
    """(complete chunks, outcome rows) of the request."""
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


KILL_USERS = 20_000
KILL_CONCURRENCY = 100


async def test_a_worker_killed_mid_chunk_resends_at_most_the_messages_in_flight(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """SIGKILL in the middle of a chunk, while sends are in flight; a new worker takes over.

    Counted at the sandbox: nobody is missing, at most ``delivery_concurrency`` devices
    got the message twice, and each second copy carried the first one's collapse id.
    """
    env = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}
    worker = start_worker(**env)
    tenant = seed_tenant()
    prefix = f"kill-{uuid.uuid4().hex[:6]}"
    users = [f"{prefix}-u{n}" for n in range(KILL_USERS)]
    add_devices([DeviceSpec(tenant.android, f"{u}-a", u, f"{u}-ta") for u in users])
    tokens = [f"{u}-ta" for u in users]
    rows = [{"User": u, "first_name": f"N{n}", "order_id": f"O{n}"} for n, u in enumerate(users)]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC), chunk_size=5000)
    notify_new_request(request_id)

    # Kill inside the second chunk (rows 5,000-9,999), at full speed.
    before = len(sandbox.state.deliveries)
    deadline = time.monotonic() + 120
    while len(sandbox.state.deliveries) - before < 7_300:
        assert time.monotonic() < deadline, f"delivery did not start:\n{worker.log_tail()}"
        await asyncio.sleep(0.002)
    worker.kill()
    await asyncio.sleep(1.0)  # requests already on the wire land
    chunks, recorded = _recorded(request_id)
    delivered = sum(1 for n in sandbox.delivered(tokens).values() if n)
    assert chunks == 1, chunks  # the first chunk complete, the second one under way
    assert 5_000 < recorded < 10_000, recorded
    assert delivered > recorded, "the kill did not catch any send in flight"
    in_flight_at_kill = delivered - recorded
    assert in_flight_at_kill <= KILL_CONCURRENCY

    start_worker(**env)  # Prefect marks the run dead (no heartbeat), the new worker takes it
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=240)
    assert state_name(run) == "COMPLETED", run.state
    counts = sandbox.delivered(tokens)
    assert [t for t, n in counts.items() if n == 0] == []  # nobody missing
    doubled = {t: n for t, n in counts.items() if n > 1}
    assert set(doubled.values()) <= {2}
    assert len(doubled) <= KILL_CONCURRENCY
    for token in doubled:  # the second copy replaces the first on the device
        per_collapse = sandbox.state.per_token_collapse[token]
        assert len(per_collapse) == 1, per_collapse
        assert "" not in per_collapse
    print(
        f"killed with {recorded} recorded and {delivered} delivered "
        f"({in_flight_at_kill} in flight); {len(doubled)} devices got it twice"
    )
    report = read_report(request_id)[tenant.android]
    assert sorted(r["user_id"] for r in report) == sorted(users)
    assert {r["error_message"] for r in report} == {""}


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
