"""Cancel fired right at the start: exactly one of cancelled / delivered, every time."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaign_trigger.deployments.worker import run_worker
from campaign_trigger.errors import RequestStateError
from campaign_trigger.services.lifecycle import cancel_request
from campaign_trigger.store.db import session_scope
from delivery_support import (
    DeviceSpec,
    add_devices,
    add_request,
    drain,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
)
from support import ManagedProcess

pytestmark = [pytest.mark.slow]

TRIALS = 24


async def test_cancel_racing_the_start_never_both_cancels_and_delivers(
    deployed: ManagedProcess, sandbox_url: str
) -> None:
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    users = [f"race-{tag}-{n}" for n in range(TRIALS)]
    add_devices([DeviceSpec(tenant.android, f"d-{u}", u, f"tok-{u}") for u in users])
    start = datetime.now(UTC) + timedelta(seconds=8)
    sends = [start + timedelta(seconds=0.4 * n) for n in range(TRIALS)]
    requests = [add_request(tenant, [u], send_at=t) for u, t in zip(users, sends, strict=True)]
    await drain()

    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            concurrency=8, stop=stop, poll_seconds=0.1, prefetch_seconds=0.2, reconcile=False
        )
    )

    async def cancel_near_start(request_id: str, send_at: datetime) -> bool:
        moment = send_at + timedelta(seconds=random.uniform(-0.45, 0.25))
        await asyncio.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))
        try:
            with session_scope() as session:
                await cancel_request(session=session, org_id=tenant.org_id, request_id=request_id)
        except RequestStateError as exc:
            refusal = exc.message
        else:
            return True
        assert refusal == "Request can't be canceled"
        return False

    try:
        cancelled = await asyncio.gather(
            *(cancel_near_start(r, t) for r, t in zip(requests, sends, strict=True))
        )
        finals = [
            await wait_for_state(r, "COMPLETED", "CANCELLED", "FAILED", "CRASHED", timeout=60)
            for r in requests
        ]
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=60)

    per_token = sandbox_stats(sandbox_url)["per_token"]
    for user, was_cancelled, run in zip(users, cancelled, finals, strict=True):
        delivered = per_token.get(f"tok-{user}", 0)
        expected = ("CANCELLED", 0) if was_cancelled else ("COMPLETED", 1)
        assert (state_name(run), delivered) == expected, (user, run.state)
    print(f"cancelled {sum(cancelled)} of {TRIALS}, delivered {TRIALS - sum(cancelled)}")
