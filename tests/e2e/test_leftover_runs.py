"""The e2e suite's own hygiene: what a test leaves unfinished does not reach the next."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaign_trigger.services import prefect_runs
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    drain,
    read_run,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import end_leftover_runs
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
