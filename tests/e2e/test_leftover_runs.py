"""The e2e suite's own hygiene: what a test leaves unfinished does not reach the next."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

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
    deployed_server: ManagedProcess,
) -> None:
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=1, prefix=f"left-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC) + timedelta(hours=1))
    await drain()  # its run is made (no worker here to make it)
    await wait_for_state(request_id, "SCHEDULED")

    await end_leftover_runs()
    assert state_name(await read_run(request_id)) == "CANCELLED"
