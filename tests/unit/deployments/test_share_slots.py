"""A worker's chunk slots for shares: at most ``size`` chunks at a time, and a share on its
last chunk hands its place on at once, so the next share starts while that chunk is sent
and its first chunk takes the slot the moment the chunk ends. A request's own shares
hold a place in the worker's chunks queue as a claimed share run does."""

from __future__ import annotations

import asyncio
import time
import uuid

import anyio
import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.context import ContextModel, FlowRunContext, TaskRunContext
from prefect.workers.base import BaseWorker

from campaign_trigger.deployments.worker import DeliveryWorker
from campaign_trigger.flows.fan_out import ShareSlots
from campaign_trigger.services import prefect_runs
from delivery_support import run_slots


class Queue:
    """A chunks queue that notes what the shares ask of it."""

    def __init__(self) -> None:
        self.handed_on: list[uuid.UUID] = []

    def hand_on(self, run_id: uuid.UUID) -> None:
        self.handed_on.append(run_id)

    def hold_place(self, run_id: uuid.UUID) -> None:
        pass

    def free_place(self, run_id: uuid.UUID) -> None:
        pass


async def test_a_share_hands_on_when_its_last_chunk_starts_and_chunks_never_overlap() -> None:
    events: list[str] = []
    queue = Queue()
    handed_on = queue.handed_on
    slots = ShareSlots(1, queue)
    first, second = uuid.uuid4(), uuid.uuid4()
    in_flight = 0

    async def share(run: uuid.UUID, name: str, chunks: int) -> None:
        nonlocal in_flight
        for n in range(1, chunks + 1):
            async with slots.chunk(run, last=n == chunks):
                in_flight += 1
                assert in_flight == 1
                events.append(f"{name}{n} start")
                await asyncio.sleep(0.02)
                events.append(f"{name}{n} end")
                in_flight -= 1

    first_share = asyncio.create_task(share(first, "a", 2))
    while not handed_on:  # the worker claims the next share only now
        await asyncio.sleep(0.001)
    assert events == ["a1 start", "a1 end", "a2 start"]
    assert handed_on == [first]
    await share(second, "b", 1)  # started while a2 is sent: it waits for a2's slot
    await first_share
    assert events == ["a1 start", "a1 end", "a2 start", "a2 end", "b1 start", "b1 end"]
    assert handed_on == [first, second]


async def test_two_slots_let_two_shares_send_at_once_and_no_third() -> None:
    slots = ShareSlots(2, Queue())
    in_flight, most = 0, 0

    async def chunk() -> None:
        nonlocal in_flight, most
        async with slots.chunk(uuid.uuid4(), last=True):
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1

    await asyncio.gather(*(chunk() for _ in range(5)))
    assert most == 2


async def test_handing_on_frees_the_shares_slot_and_polls_for_the_next_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = DeliveryWorker(concurrency=1, queue="chunks")
    worker._limiter = anyio.CapacityLimiter(1)
    share = uuid.uuid4()
    run_slots(worker).acquire_on_behalf_of_nowait(share)
    worker._polled = time.monotonic()
    assert worker.next_step() is None  # its only slot is taken
    polled = asyncio.Event()

    async def poll(self: DeliveryWorker) -> list[object]:
        polled.set()
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group
        worker.hand_on(share)
        await asyncio.wait_for(polled.wait(), timeout=5)
    assert run_slots(worker).available_tokens == 1
    worker._release_limit_slot(share)  # the run's end releases again: nothing happens
    assert run_slots(worker).available_tokens == 1


def _bare(context: type[ContextModel]) -> ContextModel:
    """A Prefect run context, as a run's task holds it (its fields do not matter here)."""
    return context.model_construct()


async def test_the_share_claimed_as_a_run_hands_on_runs_in_the_workers_context_not_that_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A share hands on from inside its chunk's task run: the next share's claim and run,
    # started from there, ran inside that run's Prefect context (Prefect's engine took
    # it for a subflow run of it), and so did every run started after them. In CI a
    # share claimed as its request's run was stopped ended unstarted with an
    # AttributeError from the engine, and its cancel left it Cancelling (for five
    # minutes, until Prefect's cancellation clean-up ended it).
    worker = DeliveryWorker(concurrency=2, queue="chunks")
    worker._limiter = anyio.CapacityLimiter(2)
    handing_on, next_share = uuid.uuid4(), FlowRun(flow_id=uuid.uuid4())
    run_slots(worker).acquire_on_behalf_of_nowait(handing_on)
    seen: list[tuple[str, object, object]] = []
    ran = asyncio.Event()

    async def poll(self: DeliveryWorker) -> list[FlowRun]:  # Prefect hands the share out
        seen.append(("poll", FlowRunContext.get(), TaskRunContext.get()))
        run_slots(self).acquire_on_behalf_of_nowait(next_share.id)
        self._submitting_flow_run_ids.add(next_share.id)
        group.start_soon(self._submit_run, next_share)
        return [next_share]

    async def claimed(*args: object, **kwargs: object) -> bool:
        return True

    async def run(flow_run: FlowRun, configuration: object) -> None:
        seen.append(("run", FlowRunContext.get(), TaskRunContext.get()))
        ran.set()

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    monkeypatch.setattr(DeliveryWorker, "client", None)  # the claim's, which says yes
    monkeypatch.setattr(prefect_runs, "claim", claimed)
    monkeypatch.setattr(worker, "run", run)
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group
        with _bare(FlowRunContext), _bare(TaskRunContext):
            worker.hand_on(handing_on)  # as a share's last chunk starts
            await asyncio.wait_for(ran.wait(), timeout=5)
    assert seen == [("poll", None, None), ("run", None, None)]


def _chunks_worker(slots: int) -> DeliveryWorker:
    worker = DeliveryWorker(concurrency=slots, queue="chunks")
    worker._limiter = anyio.CapacityLimiter(slots)
    worker._polled = time.monotonic()
    return worker


async def test_a_requests_own_share_holds_a_place_in_the_chunks_queue_until_its_last_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the place, a worker with one chunk slot claimed the next share while the
    # request's own share was being sent, and held it (waiting for that slot) from
    # workers with room for it.
    worker = _chunks_worker(1)
    slots = ShareSlots(1, worker)
    polls: list[float] = []

    async def poll(self: DeliveryWorker) -> list[object]:
        polls.append(run_slots(worker).available_tokens)
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    request_run = uuid.uuid4()
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group
        with slots.own_share(request_run):
            async with slots.chunk(request_run, last=False):
                assert worker.next_step() is None  # its only place is the request's
                assert run_slots(worker).available_tokens == 0
            async with slots.chunk(request_run, last=True):
                await asyncio.sleep(0.01)
                assert polls == [1]  # handed on: the next share is claimed during it
    assert run_slots(worker).available_tokens == 1


async def test_an_own_share_takes_no_place_already_held_and_frees_its_own_at_its_end() -> None:
    worker = _chunks_worker(2)
    slots = ShareSlots(2, worker)
    share_run, request_run, other_request = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    run_slots(worker).acquire_on_behalf_of_nowait(share_run)
    with slots.own_share(request_run):
        with slots.own_share(other_request):  # no place left: it delivers without one
            assert run_slots(worker).available_tokens == 0
        assert run_slots(worker).available_tokens == 0  # the share run's is still held
    assert run_slots(worker).available_tokens == 1  # its end freed its own (an early failure too)
    worker._release_limit_slot(share_run)
    assert run_slots(worker).available_tokens == 2
