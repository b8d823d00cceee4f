"""Two workers take over the same dead run at the same instant: it runs once.

A run whose worker died is marked Crashed by the dead-run automation; each worker's
sweep claims it with Crashed -> Pending, which the Prefect server accepts once and
refuses to the second claimant (Pending -> Pending). Here the automation's verdict is
written directly (the same state, name and message) so that both sweeps race on it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Crashed, Running
from sqlalchemy.exc import OperationalError

from campaign_trigger.deployments import upkeep
from campaign_trigger.deployments.register import ZOMBIE_MESSAGE
from campaign_trigger.deployments.worker import DeliveryWorker
from campaign_trigger.services import prefect_runs
from delivery_support import (
    DeviceSpec,
    add_devices,
    add_request,
    drain,
    load_request,
    read_run,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
    worker_on_events_only,
)
from support import ManagedProcess

pytestmark = [pytest.mark.slow]

TRIALS = 20


async def _left_crashed_by_a_dead_worker(request_id: str, ghost: str) -> None:
    """The run as the automation leaves it: claimed by the ghost, Running, then Crashed."""
    flow_run_id = load_request(request_id).flow_run_id
    assert flow_run_id is not None
    async with get_client() as client:
        claimed = await prefect_runs.claim(
            client, flow_run_id, message=f"{prefect_runs.WORKER_CLAIM_PREFIX}{ghost}"
        )
        assert claimed
        await client.set_flow_run_state(flow_run_id, Running(), force=True)
        await client.set_flow_run_state(
            flow_run_id, Crashed(message=ZOMBIE_MESSAGE, name=prefect_runs.DEAD_RUN_STATE_NAME)
        )


async def test_two_workers_taking_over_the_same_dead_run_run_it_once(
    deployed: ManagedProcess, sandbox_url: str
) -> None:
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    workers = [DeliveryWorker(concurrency=4), DeliveryWorker(concurrency=4)]
    taken_by = {w.name: 0 for w in workers}
    async with workers[0] as first, workers[1] as second:
        for trial in range(TRIALS):
            user = f"recover-{tag}-{trial}"
            add_devices([DeviceSpec(tenant.android, f"d-{user}", user, f"tok-{user}")])
            request_id = add_request(tenant, [user], send_at=datetime.now(UTC))
            await drain()
            await _left_crashed_by_a_dead_worker(request_id, ghost=f"ghost-{tag}-{trial}")

            async with get_client() as client:
                await asyncio.gather(
                    upkeep.retake_dead_runs([first], client),
                    upkeep.retake_dead_runs([second], client),
                )
            run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=60)
            assert state_name(run) == "COMPLETED", run.state
            async with get_client() as client:
                states = await client.read_flow_run_states(run.id)
            claims = [
                s.message
                for s in states
                if s.type.value == "PENDING" and s.message and "ghost" not in s.message
            ]
            assert len(claims) == 1, claims  # one claim accepted, the other refused
            owner = load_request(request_id).run_owner
            assert owner in taken_by
            taken_by[owner] += 1
            assert sandbox_stats(sandbox_url)["per_token"].get(f"tok-{user}") == 1, trial
    print(f"taken over {taken_by}")
    assert sum(taken_by.values()) == TRIALS


async def test_a_run_marked_dead_is_taken_over_as_the_server_announces_it(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep looks when the dead-run automation's state event arrives: with it never
    looking on its own, the run is still taken over and delivered once."""
    tenant = seed_tenant()
    user = f"announced-{uuid.uuid4().hex[:6]}"
    add_devices([DeviceSpec(tenant.android, f"d-{user}", user, f"tok-{user}")])
    async with worker_on_events_only(monkeypatch, poll_seconds=0.2):
        # Due in 15 s: the ghost claims it long before the worker's prefetch would (2 s).
        request_id = add_request(tenant, [user], send_at=datetime.now(UTC) + timedelta(seconds=15))
        await drain()
        await _left_crashed_by_a_dead_worker(request_id, ghost=f"ghost-{user}")
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    assert sandbox_stats(sandbox_url)["per_token"].get(f"tok-{user}") == 1


async def test_the_sweep_asks_for_runs_of_dead_workers_alone(
    deployed: ManagedProcess, sandbox_url: str
) -> None:
    """A run crashed for another reason (its request failed) is neither read nor taken:
    the sweep's question does not grow with the history of crashed runs."""
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    users = [f"sweep-{tag}-{n}" for n in range(2)]
    add_devices([DeviceSpec(tenant.android, f"d-{u}", u, f"tok-{u}") for u in users])
    failed, dead = (add_request(tenant, [u], send_at=datetime.now(UTC)) for u in users)
    await drain()
    await _left_crashed_by_a_dead_worker(dead, ghost=f"ghost-{tag}")
    failed_run = load_request(failed).flow_run_id
    assert failed_run is not None
    async with get_client() as client:
        await prefect_runs.claim(client, failed_run, message="elsewhere")
        await client.set_flow_run_state(failed_run, Running(), force=True)
        await client.set_flow_run_state(failed_run, Crashed(message="Execution was interrupted"))
        asked = await prefect_runs.runs_in_states(
            client, states=[StateType.CRASHED], names=[prefect_runs.DEAD_RUN_STATE_NAME]
        )
        assert str(load_request(dead).flow_run_id) in {str(r.id) for r in asked}
        assert failed_run not in {str(r.id) for r in asked}
        async with DeliveryWorker(concurrency=4) as worker:
            assert await upkeep.retake_dead_runs([worker], client) >= 1
            run = await wait_for_state(dead, "COMPLETED", "FAILED", timeout=60)
            assert state_name(run) == "COMPLETED", run.state
    assert sandbox_stats(sandbox_url)["per_token"].get(f"tok-{users[1]}") == 1
    assert sandbox_stats(sandbox_url)["per_token"].get(f"tok-{users[0]}") is None
    async with get_client() as client:
        still = await client.read_flow_run(uuid.UUID(failed_run))
    assert still.state is not None
    assert still.state.name == "Crashed"


async def test_a_dead_run_taken_over_while_the_database_refuses_a_write_still_runs(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The taker's first write after its claim (the request's ``run_owner``) fails, as it
    does while a frozen worker holds SQLite's write lock: the claimed run still runs, and
    its slot is not kept (a run claimed and left would be marked dead again, and the
    slot it kept would make every later sweep of this worker fail on it)."""
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    users = [f"locked-{tag}-{n}" for n in range(2)]
    add_devices([DeviceSpec(tenant.android, f"d-{u}", u, f"tok-{u}") for u in users])
    requests = [add_request(tenant, [u], send_at=datetime.now(UTC)) for u in users]
    await drain()
    for n, request_id in enumerate(requests):
        await _left_crashed_by_a_dead_worker(request_id, ghost=f"ghost-{tag}-{n}")

    async def locked(run: object, *, owner: str) -> None:
        raise OperationalError("UPDATE request", {}, Exception("database is locked"))

    monkeypatch.setattr(upkeep, "own_run", locked)
    async with DeliveryWorker(concurrency=1) as worker, get_client() as client:
        for request_id in requests:
            run = await _swept_until_ended(worker, client, request_id)
            assert state_name(run) == "COMPLETED", run.state
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(f"tok-{u}") for u in users] == [1, 1]


async def _swept_until_ended(
    worker: DeliveryWorker, client: PrefectClient, request_id: str, timeout: float = 120
) -> FlowRun:
    """Sweep with the worker's one slot until the request's dead run has been taken over
    and has ended. The sweep takes the longest-waiting dead run first, and earlier tests
    of the session may have left some on its Prefect server: each run the slot takes must
    end and give the slot back before the next is taken (a slot kept would take none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        taken = await upkeep.retake_dead_runs([worker], client)
        assert taken <= 1, taken  # one slot
        while worker.active and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        run = await read_run(request_id)
        if run is not None and state_name(run) in ("COMPLETED", "FAILED"):
            return run
        await asyncio.sleep(0.1)
    raise AssertionError(f"the dead run of {request_id} was never taken over and ended")
