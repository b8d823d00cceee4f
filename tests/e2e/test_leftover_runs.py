"""The suite's own hygiene: what a test leaves unfinished does not reach the next."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaign_trigger.services import prefect_runs
from campaign_trigger.store.models import RequestState
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    drain,
    load_request,
    read_run,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import end_leftover_runs
from leftovers import Leftovers
from support import ManagedProcess

pytestmark = [pytest.mark.e2e]


async def test_runs_a_test_leaves_unfinished_are_cancelled_at_its_end(
    deployed_server: ManagedProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every one, however many pages of runs they make (the session gathers more than a
    page of runs scheduled ahead by tests without a worker: CI, 28 Nov)."""
    monkeypatch.setattr(prefect_runs, "PAGE_LIMIT", 2)
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=1, prefix=f"left-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    send_at = datetime.now(UTC) + timedelta(hours=1)
    request_ids = [add_request(tenant, audience.users, send_at=send_at) for _ in range(3)]
    await drain()  # their runs are made (no worker here to make them)
    for request_id in request_ids:
        await wait_for_state(request_id, "SCHEDULED")

    await end_leftover_runs()
    for request_id in request_ids:
        assert state_name(await read_run(request_id)) == "CANCELLED"


async def test_what_a_test_left_to_send_is_cancelled_and_what_came_before_it_is_kept(
    deployed_server: ManagedProcess, session_database: str
) -> None:
    """The suite-wide fixture's work (``leftovers.Leftovers``), for every test: a request
    left in the outbox and a run left scheduled ahead, both made during the test, are
    cancelled; a request in the outbox and a run made before the test are kept."""
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=1, prefix=f"left-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    send_at = datetime.now(UTC) + timedelta(hours=1)

    def request() -> str:
        return add_request(tenant, audience.users, send_at=send_at)

    scheduled_before = request()
    await drain()
    during = Leftovers.before(session_database)
    scheduled_during = request()
    await drain()
    in_outbox = request()
    after = Leftovers.before(session_database)

    after.cancel(prefect=True)
    assert load_request(in_outbox).state == RequestState.scheduled
    assert state_name(await read_run(scheduled_during)) == "SCHEDULED"

    during.cancel(prefect=True)
    assert load_request(in_outbox).state == RequestState.canceled
    assert load_request(in_outbox).flow_run_id is None  # never drained
    assert state_name(await read_run(scheduled_during)) == "CANCELLED"
    assert state_name(await read_run(scheduled_before)) == "SCHEDULED"
