"""The delivery worker is a Prefect worker of its pool: it shows in the pool's worker
list, a run scheduled in its queue wakes it, idle it asks the server nothing yet claims
a run scheduled ahead in time, its pool offers no job variable, a paused
pool gets nothing claimed, a concurrency limit of one on the pool or on the requests'
queue runs one delivery at a time,
every request's steps are task runs, and a run suspended in the UI stops at its next
step."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import WorkPoolUpdate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, State, StateType, TaskRun
from prefect.client.schemas.responses import OrchestrationResult, SetStateStatus
from prefect.states import Suspended
from prefect.workers.base import BaseWorker

from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.deployments.catalog import DELIVER_REQUEST, DELIVERY_POOL
from campaign_trigger.deployments.worker import DeliveryWorker
from delivery_support import (
    DeviceSpec,
    add_devices,
    add_request,
    drain,
    read_report,
    read_run,
    recorded_task_runs,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
    worker_on_events_only,
)
from support import ManagedProcess

pytestmark = [pytest.mark.slow]

REQUESTS_QUEUE = DELIVER_REQUEST.work_queue  # the pool's queue of the requests' runs


@pytest.fixture
async def pool_settings(deployed: ManagedProcess) -> AsyncIterator[None]:
    """Whatever a test changes of the delivery pool and its requests' queue is undone
    after it."""
    yield
    async with get_client() as client:
        await client.update_work_pool(
            DELIVERY_POOL, WorkPoolUpdate(is_paused=False, concurrency_limit=None)
        )
        queue = await client.read_work_queue_by_name(REQUESTS_QUEUE, work_pool_name=DELIVERY_POOL)
        await client.update_work_queue(queue.id, concurrency_limit=None)


def _one_user_requests(count: int) -> list[str]:
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    users = [f"w-{tag}-{n}" for n in range(count)]
    add_devices([DeviceSpec(tenant.android, f"d-{u}", u, f"tok-{u}") for u in users])
    return [add_request(tenant, [u], send_at=datetime.now(UTC)) for u in users]


async def test_the_worker_shows_online_in_its_pools_worker_list(worker: None) -> None:
    deadline = time.monotonic() + 30
    async with get_client() as client:
        while True:
            workers = await client.read_workers_for_work_pool(DELIVERY_POOL)
            online = [w for w in workers if w.status.value == "ONLINE"]
            if online:
                break
            assert time.monotonic() < deadline, workers
            await asyncio.sleep(0.5)
    assert all(w.last_heartbeat_time is not None for w in online)


async def test_a_request_wakes_the_worker_of_its_queue_through_prefects_events(
    worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An idle worker polls its queues every 2nd or 4th tick only (a poll costs the Prefect
    # server ~23 ms of CPU); the server's flow-run Scheduled event makes it poll at once.
    woken: list[str] = []
    wake = DeliveryWorker.wake

    def recorded(self: DeliveryWorker) -> None:
        woken.append(self.queue)
        wake(self)

    monkeypatch.setattr(DeliveryWorker, "wake", recorded)
    # The first request is delivered as the worker subscribes to the events (one made
    # before would be neither streamed nor, not yet written, replayed); the second wakes.
    for _ in range(2):
        woken.clear()
        [request_id] = _one_user_requests(1)
        await drain()
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
        assert state_name(run) == "COMPLETED", run.state if run else None
    assert "default" in woken
    assert "chunks" not in woken  # a one-chunk request makes no share


async def test_an_idle_worker_asks_the_server_nothing_and_claims_a_run_scheduled_ahead_in_time(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its event stream up an idle worker neither polls nor looks (each poll cost the
    server ~23 ms of CPU, every 2nd or 4th tick of every idle worker); a request scheduled
    ahead is still claimed within the prefetch, and starts just before its time, let
    through by the server at once (started on its claim, it was told to wait whole
    seconds and started up to half a second late): its message goes at its time, not
    before."""
    asked: list[tuple[str, str, datetime]] = []
    poll, look = BaseWorker.get_and_submit_flow_runs, DeliveryWorker._look_ahead
    set_state = PrefectClient.set_flow_run_state
    running: list[SetStateStatus] = []  # the server's answers to the run's Running

    async def proposed(
        self: PrefectClient, flow_run_id: UUID | str, state: State[Any], force: bool = False
    ) -> OrchestrationResult[Any]:
        result = await set_state(self, flow_run_id, state, force=force)
        if state.type == StateType.RUNNING:
            running.append(result.status)
        return result

    async def polled(self: DeliveryWorker) -> list[FlowRun]:
        asked.append((self.queue, "poll", datetime.now(UTC)))
        return await poll(self)

    async def looked(self: DeliveryWorker) -> None:
        asked.append((self.queue, "look", datetime.now(UTC)))
        await look(self)

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", polled)
    monkeypatch.setattr(DeliveryWorker, "_look_ahead", looked)
    monkeypatch.setattr(PrefectClient, "set_flow_run_state", proposed)
    tenant = seed_tenant()
    user = f"ahead-{uuid.uuid4().hex[:6]}"
    add_devices([DeviceSpec(tenant.android, f"d-{user}", user, f"tok-{user}")])
    async with worker_on_events_only(monkeypatch, poll_seconds=0.3):  # no sweep's own look
        await asyncio.sleep(5)  # the subscription's wake: a poll, then two looks, a queue
        asked.clear()
        await asyncio.sleep(6)  # ~15 ticks of each queue
        assert asked == []
        send_at = datetime.now(UTC) + timedelta(seconds=6)
        request_id = add_request(tenant, [user], send_at=send_at)
        await drain()
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED", run.state
    assert sandbox_stats(sandbox_url)["per_token"].get(f"tok-{user}") == 1
    assert run.start_time is not None
    late = run.start_time.timestamp() - send_at.timestamp()
    print(f"\nstarted {late:.2f} s after its time; the worker asked the server:")
    for queue, what, when in asked:
        print(f"  {queue:8} {what} {(when - send_at).total_seconds():+.2f} s")
    # The server lets a run start at most half a second early; a loaded machine's margin
    # after: without the look-ahead it would wait for its Late event (15 s after its time)
    # or the 30 s poll.
    assert -0.5 <= late < 3
    assert running == [SetStateStatus.ACCEPT]  # not told to wait, then proposed again
    [row] = [row for rows in read_report(request_id).values() for row in rows]
    assert datetime.fromisoformat(row["sent_at"]) >= send_at
    claims = [when for queue, what, when in asked if (queue, what) == ("default", "poll")]
    assert any(send_at - timedelta(seconds=2.5) < when <= send_at for when in claims)
    assert len(claims) <= 4  # its event's, the due one's, keep-ready's at most; not 20
    assert "chunks" not in {queue for queue, _, _ in asked}  # no share, no event there


async def test_a_paused_pool_gets_no_run_claimed_until_it_is_resumed(
    worker: None, pool_settings: None
) -> None:
    async with get_client() as client:
        await client.update_work_pool(DELIVERY_POOL, WorkPoolUpdate(is_paused=True))
    [request_id] = _one_user_requests(1)
    await drain()
    await asyncio.sleep(4)  # several polls of the worker
    run = await read_run(request_id)
    assert state_name(run) == "SCHEDULED"
    async with get_client() as client:
        await client.update_work_pool(DELIVERY_POOL, WorkPoolUpdate(is_paused=False))
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"


@pytest.mark.parametrize("limited", ["pool", "queue"])
async def test_a_concurrency_limit_of_one_runs_one_delivery_at_a_time(
    worker: None, pool_settings: None, sandbox_state: SandboxState, limited: str
) -> None:
    """A limit set on the pool, or on the queue the requests' runs are in (as the UI's
    Work Pools page sets either)."""
    async with get_client() as client:
        if limited == "pool":
            await client.update_work_pool(DELIVERY_POOL, WorkPoolUpdate(concurrency_limit=1))
        else:
            queue = await client.read_work_queue_by_name(
                REQUESTS_QUEUE, work_pool_name=DELIVERY_POOL
            )
            await client.update_work_queue(queue.id, concurrency_limit=1)
    sandbox_state.configure(latency_ms=700)  # each delivery lasts at least 0.7 s
    try:
        requests = _one_user_requests(3)
        await drain()
        runs = [await wait_for_state(r, "COMPLETED", "FAILED", timeout=90) for r in requests]
    finally:
        sandbox_state.configure(latency_ms=0)
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id for r in runs]))
        )
    spans = sorted((r.start_time, r.end_time) for r in runs)
    assert all(start is not None and end is not None for start, end in spans)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start  # type: ignore[operator]  # never two at once


async def test_the_pool_offers_no_job_variables_and_an_earlier_pool_is_given_that_template(
    deployed: ManagedProcess, pool_settings: None
) -> None:
    """The worker runs everything in-process: its pool's template has no job variable
    (the server validates each run it creates against them). A pool an earlier version
    made with Prefect's default template gets it, keeping the operator's settings."""
    from campaign_trigger.deployments.register import ensure_deployments

    async with get_client() as client:
        pool = await client.read_work_pool(DELIVERY_POOL)
        assert pool.base_job_template == DeliveryWorker.get_default_base_job_template() == {}
        prefects = BaseWorker.get_default_base_job_template()
        assert prefects["variables"]["properties"]  # command, env, labels, name
        await client.update_work_pool(
            DELIVERY_POOL, WorkPoolUpdate(base_job_template=prefects, concurrency_limit=3)
        )
        await ensure_deployments()
        pool = await client.read_work_pool(DELIVERY_POOL)
    assert pool.base_job_template == {}
    assert pool.concurrency_limit == 3


async def test_a_one_message_request_shows_its_steps_as_completed_task_runs(
    worker: None,
) -> None:
    [request_id] = _one_user_requests(1)
    await drain()
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"

    def steps_of(task_runs: list[TaskRun]) -> dict[str, str | None]:
        return {t.name: t.state.type.value if t.state else None for t in task_runs}

    task_runs = await recorded_task_runs(
        [run.id], lambda runs: list(steps_of(runs).values()) == ["COMPLETED"] * 3
    )
    steps = steps_of(task_runs)
    assert steps == {
        "prepare delivery": "COMPLETED",
        "deliver chunk 1/1": "COMPLETED",
        "assemble report": "COMPLETED",
    }


async def test_a_delivery_suspended_in_the_ui_stops_at_its_next_step(
    worker: None, sandbox_state: SandboxState
) -> None:
    sandbox_state.configure(latency_ms=2000)  # the chunk's send lasts 2 s
    try:
        [request_id] = _one_user_requests(1)
        await drain()
        run = await wait_for_state(request_id, "RUNNING", timeout=60)
        async with get_client() as client:
            # what the UI's Suspend proposes for a running deployment run
            await client.set_flow_run_state(run.id, Suspended(timeout_seconds=300))
        await asyncio.sleep(6)  # the chunk is done: the report would have begun
        run = await read_run(request_id)  # type: ignore[assignment]
    finally:
        sandbox_state.configure(latency_ms=0)
    assert run.state is not None
    assert run.state.name == "Suspended"
    async with get_client() as client:
        task_runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
    assert "assemble report" not in {t.name for t in task_runs}


async def test_a_worker_whose_queue_stopped_serving_ends_to_be_started_again(
    deployed: ManagedProcess,
) -> None:
    """Prefect's polling and heartbeat loops end a worker's ``start`` after about twelve
    failures in a row (a Prefect server out for minutes): the process, alive, claimed
    nothing more and looked idle, until it was stopped. It now ends at once, saying to
    start it again (``campaign-trigger worker`` exits with 75)."""
    from campaign_trigger.deployments.worker import run_worker

    async def start(self: DeliveryWorker, *args: object, **kwargs: object) -> None:
        await asyncio.sleep(1)  # serving a while
        raise RuntimeError("Service exceeded error threshold")  # as Prefect's loops say

    stop = asyncio.Event()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeliveryWorker, "start", start)
        restart = await asyncio.wait_for(run_worker(concurrency=1, stop=stop), timeout=60)
    assert restart is True
