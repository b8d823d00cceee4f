"""When a delivery worker polls its queue: at once when a run is scheduled in it (a
Prefect event woke it), or once its last poll is ``wake_gap`` old; without an event
stream every ``idle_poll_factor``-th tick else (a share running or being made in its
process included: the shares' own events start them); with the stream up, at those
ticks, a look-up of the earliest run scheduled after each event, and a poll as that run
comes within the prefetch or while it is left due; never while every slot is taken, and
at least every ``KEEP_READY_SECONDS`` whatever the rest; a look after a poll once its
runs are claimed, and a wake's poll not when a poll since the wake went first; when a
run ends, if a run was scheduled while every slot was taken; which queue an event wakes,
and which of the upkeep's looks (the cancel watch, the dead-run sweep) a run's event
starts."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc
import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.events.schemas.events import Event
from prefect.workers.base import BaseWorker

from campaign_trigger.deployments import upkeep, wakeup
from campaign_trigger.deployments.catalog import DELIVERY_POOL
from campaign_trigger.deployments.wakeup import dispatch, queue_of
from campaign_trigger.deployments.worker import KEEP_READY_SECONDS, DeliveryWorker
from delivery_support import run_slots


def _polled_a_tick_ago(*, slots: int = 2, taken: int = 0) -> DeliveryWorker:
    worker = DeliveryWorker(concurrency=slots, queue="chunks", idle_poll_factor=4)
    worker._limiter = anyio.CapacityLimiter(slots)
    for n in range(taken):
        run_slots(worker).acquire_on_behalf_of_nowait(n)
    worker._polled = time.monotonic() - worker.wake_gap  # ticks are that far apart at least
    return worker


def _ticks(worker: DeliveryWorker, count: int) -> list[bool]:
    return [worker.next_step() == "poll" for _ in range(count)]


async def test_an_unwoken_queue_is_polled_every_fourth_tick() -> None:
    assert _ticks(_polled_a_tick_ago(), 8) == [False, False, False, True] * 2


async def test_a_worker_running_a_share_polls_every_fourth_tick_not_every_tick() -> None:
    # The next share wakes the queue with its event, or is claimed as this one hands on:
    # polling every tick meanwhile cost the Prefect server ~23 ms of CPU a tick.
    assert _ticks(_polled_a_tick_ago(taken=1), 8) == [False, False, False, True] * 2


async def test_a_worker_with_every_slot_taken_does_not_poll() -> None:
    assert _ticks(_polled_a_tick_ago(taken=2), 8) == [False] * 8


async def test_a_queue_unpolled_for_too_long_is_polled_whatever_the_rest() -> None:
    worker = _polled_a_tick_ago(taken=2)
    worker._polled = time.monotonic() - KEEP_READY_SECONDS
    assert worker.next_step() == "poll"


async def test_a_woken_queue_is_polled_at_the_next_tick_with_a_free_slot_then_idles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = _polled_a_tick_ago(taken=2)
    worker.wake()
    assert worker.next_step() is None  # every slot taken: it stays woken
    run_slots(worker).release_on_behalf_of(0)
    polled: list[DeliveryWorker] = []

    async def poll(self: DeliveryWorker) -> list[object]:
        polled.append(self)
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    await worker.get_and_submit_flow_runs()  # tick 2, off the idle pace: woken
    assert polled == [worker]
    worker._polled -= worker.wake_gap  # the next ticks come later
    assert _ticks(worker, 3) == [False, True, False]  # used up: ticks 3-5, the 4th polls


async def test_a_tick_right_after_a_poll_off_the_ticks_does_not_poll_at_the_idle_pace() -> None:
    worker = _polled_a_tick_ago(taken=1)  # its 4th tick would poll at the idle pace
    worker._polled = time.monotonic()  # a wake's or a hand-on's poll, just now
    assert _ticks(worker, 4) == [False] * 4
    worker.wake()  # a run scheduled since: polled whatever the pace
    assert worker.next_step() == "poll"


class _Server:
    """The Prefect server as a worker's ticks see it: one run scheduled in the queue at
    ``due`` (None: none), handed out by a poll whose window holds it unless ``holding``
    (a paused pool, a concurrency limit); what it was asked, tick by tick."""

    def __init__(self, due: datetime | None, *, holding: bool = False) -> None:
        self.due, self.holding = due, holding
        self.asked: list[str] = []
        self.meanwhile: Callable[[], None] = lambda: None  # while it answers a look

    async def read_flow_runs(self, **query: object) -> list[FlowRun]:
        self.asked.append("look")
        self.meanwhile()
        if self.due is None:
            return []
        return [FlowRun(flow_id=uuid.uuid4(), next_scheduled_start_time=self.due)]

    def poll(self, worker: DeliveryWorker) -> None:
        self.asked.append("poll")
        if self.due is not None and self.due <= worker._polled_window and not self.holding:
            self.due = None


def _streamed(server: _Server, monkeypatch: pytest.MonkeyPatch) -> DeliveryWorker:
    """A worker whose event stream is up, asking ``server``; its ticks as fast as
    wanted (no gap after a poll)."""

    async def poll(self: DeliveryWorker) -> list[FlowRun]:
        server.poll(self)
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    worker = _polled_a_tick_ago()
    worker.events_up, worker.wake_gap = True, 0.0
    worker._client = server  # type: ignore[assignment]
    return worker


async def _ticks_asked(worker: DeliveryWorker, server: _Server, count: int) -> list[list[str]]:
    """What each of ``count`` ticks asked the server."""
    asked = []
    for _ in range(count):
        before = len(server.asked)
        await worker.get_and_submit_flow_runs()
        asked.append(server.asked[before:])
    return asked


async def test_with_the_stream_up_an_idle_queue_looks_ahead_once_then_asks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _Server(due=None)
    worker = _streamed(server, monkeypatch)
    assert await _ticks_asked(worker, server, 4) == [[], [], [], ["look"]]  # at the idle pace
    assert await _ticks_asked(worker, server, 40) == [[]] * 40  # nothing scheduled
    worker._polled = time.monotonic() - KEEP_READY_SECONDS
    assert await _ticks_asked(worker, server, 1) == [["poll"]]  # the queue still shows ready


async def test_a_run_scheduled_ahead_is_polled_for_as_it_comes_within_the_prefetch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _Server(due=None)
    worker = _streamed(server, monkeypatch)
    server.due = worker._window() + timedelta(seconds=0.5)
    assert await _ticks_asked(worker, server, 8) == [[], [], [], ["look"], [], [], [], []]
    await asyncio.sleep(0.6)
    # At the next tick, not at the idle pace; then the next earliest is looked up.
    assert await _ticks_asked(worker, server, 1) == [["poll", "look"]]
    assert server.due is None  # handed out
    assert await _ticks_asked(worker, server, 8) == [[]] * 8


async def test_a_look_finding_a_run_due_polls_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs staggered closer than the idle pace: each one found is claimed in that tick.
    server = _Server(due=datetime.now(UTC))
    worker = _streamed(server, monkeypatch)
    assert await _ticks_asked(worker, server, 4) == [[], [], [], ["look", "poll", "look"]]
    assert server.due is None


async def test_a_run_left_due_is_polled_for_at_the_idle_pace_until_it_is_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A paused pool, a concurrency limit: the server hands nothing out, and no event
    # comes when it would; the run is found left due at each look, and polled for.
    server = _Server(due=datetime.now(UTC) - timedelta(seconds=20), holding=True)
    worker = _streamed(server, monkeypatch)
    idle_pace = [[], [], [], ["poll", "look"]]
    assert await _ticks_asked(worker, server, 4) == [[], [], [], ["look", "poll", "look"]]
    assert await _ticks_asked(worker, server, 8) == idle_pace * 2
    server.holding = False  # the pool resumed
    assert await _ticks_asked(worker, server, 4) == idle_pace
    assert server.due is None
    assert await _ticks_asked(worker, server, 8) == [[]] * 8


async def test_an_event_makes_the_earliest_run_unknown_even_during_a_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _Server(due=None)
    worker = _streamed(server, monkeypatch)
    assert await _ticks_asked(worker, server, 4) == [[], [], [], ["look"]]
    worker.wake()  # a run scheduled: maybe ahead; looked for twice, at two idle ticks
    looked_twice = [["poll"], [], [], ["look"], [], [], [], ["look"], [], [], [], []]
    assert await _ticks_asked(worker, server, 12) == looked_twice
    worker.wake()
    server.meanwhile = worker.wake  # a run scheduled while the server answers the look
    assert await _ticks_asked(worker, server, 4) == [["poll"], [], [], ["look"]]
    assert not worker._due_known  # the answer may predate that run: polled, looked again
    server.meanwhile = lambda: None
    assert await _ticks_asked(worker, server, 12) == looked_twice
    assert worker._due_known


async def test_a_run_an_event_announced_before_the_server_shows_it_is_polled_for_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _Server(due=None)
    worker = _streamed(server, monkeypatch)
    worker.wake()
    assert await _ticks_asked(worker, server, 1) == [["poll"]]  # the server shows no run yet
    server.due = datetime.now(UTC) - timedelta(seconds=0.5)  # now it does: due
    asked = await _ticks_asked(worker, server, 4)  # at the next idle tick
    assert [step for step in asked if step] == [["look", "poll", "look"]]
    assert server.due is None  # handed out


async def test_a_poll_waits_until_the_runs_the_last_one_was_handed_are_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server counts a run against a concurrency limit once it is Pending: a poll while
    # a claim is on its way was handed a second run under a limit of one.
    worker = _polled_a_tick_ago(slots=2)
    claimed, polls = asyncio.Event(), []

    async def claim_and_start(flow_run: FlowRun) -> bool:
        await claimed.wait()
        return True

    monkeypatch.setattr(worker, "_claim_and_start", claim_and_start)
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group

        async def poll(self: DeliveryWorker) -> list[FlowRun]:
            polls.append(time.monotonic())
            run = FlowRun(flow_id=uuid.uuid4())
            self._submitting_flow_run_ids.add(run.id)  # as Prefect's submission does
            group.start_soon(self._submit_run, run)
            return [run]

        monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
        await worker._poll()
        second = asyncio.create_task(worker._poll())  # a wake's, beside a tick's
        await asyncio.sleep(0.2)
        assert len(polls) == 1  # the first run's claim is on its way
        claimed.set()
        await asyncio.wait_for(second, timeout=5)
        assert len(polls) == 2


async def test_a_take_over_during_a_poll_does_not_hold_the_next_poll_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A run taken over while a poll waited for the server was counted as that poll's
    # claim, and never counted down: every later poll waited for it, the queue unpolled.
    worker = _polled_a_tick_ago(slots=2)
    polls: list[float] = []

    async def poll(self: DeliveryWorker) -> list[FlowRun]:
        polls.append(time.monotonic())
        await asyncio.sleep(0)  # the server answers; meanwhile a run is taken over
        self._submitting_flow_run_ids.add(uuid.uuid4())  # as take_over does
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    await worker._poll()
    await asyncio.wait_for(worker._poll(), timeout=5)
    assert len(polls) == 2


def _handing_out(
    worker: DeliveryWorker,
    group: anyio.abc.TaskGroup,
    monkeypatch: pytest.MonkeyPatch,
    claimed: Callable[[], Awaitable[object]],
) -> list[float]:
    """Each poll of ``worker`` hands out a run, claimed once ``claimed`` returns (as
    Prefect's submission does); the times of the polls."""
    polls: list[float] = []

    async def claim_and_start(flow_run: FlowRun) -> bool:
        await claimed()
        return True

    async def poll(self: DeliveryWorker) -> list[FlowRun]:
        polls.append(time.monotonic())
        run = FlowRun(flow_id=uuid.uuid4())
        self._submitting_flow_run_ids.add(run.id)
        group.start_soon(self._submit_run, run)
        return [run]

    worker._runs_task_group = group
    monkeypatch.setattr(worker, "_claim_and_start", claim_and_start)
    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    return polls


async def test_the_look_after_a_due_poll_waits_for_its_claims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Else the look finds the run just handed out still scheduled: left due, it is polled
    # for again at the idle pace.
    server = _Server(due=datetime.now(UTC))
    worker = _streamed(server, monkeypatch)

    async def claimed() -> None:
        await asyncio.sleep(0.05)  # the claim's round trip
        server.due = None

    async with anyio.create_task_group() as group:
        polls = _handing_out(worker, group, monkeypatch, claimed)
        asked = await _ticks_asked(worker, server, 12)
    assert [step for step in asked if step] == [["look", "look"]]  # the poll between
    assert len(polls) == 1


async def test_a_wakes_poll_is_not_made_when_a_poll_since_the_wake_went_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = _polled_a_tick_ago(slots=2)
    worker.wake_gap = 0.0
    claimed = asyncio.Event()
    async with anyio.create_task_group() as group:
        polls = _handing_out(worker, group, monkeypatch, claimed.wait)
        await worker._poll()  # its run's claim on its way
        tick = asyncio.create_task(worker._poll())  # waits for that claim
        await asyncio.sleep(0.1)
        worker.wake()  # a run scheduled: the tick's poll, still to come, will find it
        await asyncio.sleep(0.1)
        claimed.set()
        await asyncio.wait_for(tick, timeout=5)
        await asyncio.sleep(0.2)
    assert len(polls) == 2  # the first, the tick's; the wake's not made


def _scheduled(pool: str, queue: str, *, state: str = "Scheduled") -> Event:
    return Event(
        event=f"prefect.flow-run.{state}",
        resource={"prefect.resource.id": f"prefect.flow-run.{uuid.uuid4()}"},
        related=[
            {
                "prefect.resource.id": f"prefect.work-pool.{uuid.uuid4()}",
                "prefect.resource.role": "work-pool",
                "prefect.resource.name": pool,
            },
            {
                "prefect.resource.id": f"prefect.work-queue.{uuid.uuid4()}",
                "prefect.resource.role": "work-queue",
                "prefect.resource.name": queue,
            },
        ],
    )


def test_an_event_names_the_delivery_pools_queue_its_run_is_scheduled_in() -> None:
    assert queue_of(_scheduled(DELIVERY_POOL, "chunks")) == "chunks"
    assert queue_of(_scheduled(DELIVERY_POOL, "default")) == "default"
    assert queue_of(_scheduled("another-pool", "default")) is None


def test_a_run_cancelling_or_marked_dead_starts_the_cancel_watch_or_the_sweep() -> None:
    worker = DeliveryWorker(concurrency=1, queue="default")
    woken: list[DeliveryWorker] = []
    worker.wake = lambda: woken.append(worker)  # type: ignore[method-assign]
    sweeps, served = upkeep.Sweeps(), {worker.queue: worker}

    dispatch(_scheduled(DELIVERY_POOL, "default", state="Cancelling"), served, sweeps)
    assert (sweeps.cancelling.is_set(), sweeps.dead.is_set(), woken) == (True, False, [])
    dispatch(_scheduled(DELIVERY_POOL, "default", state="Worker lost"), served, sweeps)
    assert (sweeps.dead.is_set(), woken) == (True, [])
    dispatch(_scheduled(DELIVERY_POOL, "default"), served, sweeps)
    assert woken == [worker]

    sweeps = upkeep.Sweeps()  # runs of a queue or a pool this process does not serve
    for event in (
        _scheduled(DELIVERY_POOL, "chunks", state="Cancelling"),
        _scheduled("another-pool", "default", state="Worker lost"),
        _scheduled("another-pool", "default"),
    ):
        dispatch(event, served, sweeps)
    assert (sweeps.cancelling.is_set(), sweeps.dead.is_set(), woken) == (False, False, [worker])


async def test_each_subscription_wakes_every_queue_and_a_lost_stream_means_the_idle_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subscription wakes both queues (runs scheduled while there was none), marks them
    streamed (no idle polls), and a lost stream marks them not (idle polls again)."""
    workers = [DeliveryWorker(concurrency=1, queue=queue) for queue in ("default", "chunks")]
    woken: list[tuple[str, bool]] = []
    for worker in workers:
        monkeypatch.setattr(worker, "wake", lambda w=worker: woken.append((w.queue, w.events_up)))
    stop, subscriptions = asyncio.Event(), list[dict[str, object]]()

    async def events() -> AsyncIterator[Event]:
        yield _scheduled(DELIVERY_POOL, "default")
        if len(subscriptions) == 2:
            stop.set()
        raise ConnectionError("the server restarted")

    @contextlib.asynccontextmanager
    async def subscriber(**options: object) -> AsyncIterator[AsyncIterator[Event]]:
        subscriptions.append(options)
        yield events()

    monkeypatch.setattr(wakeup, "get_events_subscriber", subscriber)
    monkeypatch.setattr(wakeup, "RESUBSCRIBE_SECONDS", 0.01)
    await asyncio.wait_for(wakeup.wake_on_events(workers, upkeep.Sweeps(), stop), timeout=5)
    each_subscription = [("default", True), ("chunks", True), ("default", True)]
    assert woken == each_subscription * 2  # both queues, then the event's queue
    assert [worker.events_up for worker in workers] == [False, False]


async def test_a_sweep_looks_at_once_then_when_woken_not_only_at_its_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upkeep, "get_client", _NoClient)
    stop, woken = asyncio.Event(), asyncio.Event()
    looked: list[int] = []
    step_started = asyncio.Event()

    async def step(client: object) -> None:
        looked.append(len(looked))
        step_started.set()
        if len(looked) == 2:
            woken.set()  # an event during a look: one more right after it
        await asyncio.sleep(0)

    loop = asyncio.create_task(upkeep.every(lambda: 3600.0, stop, "test", step, woken=woken))
    await asyncio.wait_for(step_started.wait(), timeout=5)
    assert looked == [0]  # at once, then nothing for an hour
    await asyncio.sleep(0.05)
    assert looked == [0]
    woken.set()
    while len(looked) < 3:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert looked == [0, 1, 2]  # woken, and again for the wake during the second
    stop.set()
    await asyncio.wait_for(loop, timeout=5)


async def test_a_look_an_event_woke_is_made_once_more_a_moment_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The event can reach the worker before the server reads back the state it
    announced: the look it woke is repeated ``AGAIN_SECONDS`` later, once."""
    monkeypatch.setattr(upkeep, "get_client", _NoClient)
    monkeypatch.setattr(upkeep, "AGAIN_SECONDS", 0.1)
    stop, woken = asyncio.Event(), asyncio.Event()
    looked: list[float] = []

    async def step(client: object) -> None:
        looked.append(time.monotonic())

    loop = asyncio.create_task(upkeep.every(lambda: 3600.0, stop, "test", step, woken=woken))
    await asyncio.sleep(0.3)
    assert len(looked) == 1  # at once; not woken: no repeat
    woken.set()
    await asyncio.sleep(0.5)
    assert len(looked) == 3  # woken, then once more, then nothing for an hour
    assert looked[2] - looked[1] >= 0.1
    stop.set()
    await asyncio.wait_for(loop, timeout=5)


class _NoClient:
    async def __aenter__(self) -> object:
        return object()

    async def __aexit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def polled(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each poll of the pool began (Prefect's poll itself replaced)."""
    began: list[float] = []

    async def poll(self: DeliveryWorker) -> list[object]:
        began.append(time.monotonic())
        return []

    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", poll)
    return began


async def test_a_wake_polls_at_once_or_once_the_last_poll_is_a_gap_old(
    polled: list[float],
) -> None:
    async def until_polled(count: int, within: float) -> None:
        deadline = time.monotonic() + within
        while len(polled) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    worker = _polled_a_tick_ago(taken=1)
    worker.wake_gap = 1.0
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group
        worker._polled -= 2.0  # the last poll a while ago: at once
        woken = time.monotonic()
        worker.wake()
        worker.wake()  # a second wake meanwhile: one poll
        await until_polled(1, within=0.5)
        assert len(polled) == 1
        assert polled[0] - woken < 0.5

        worker.wake()  # polled just now: once the gap has passed
        await asyncio.sleep(0.5)
        assert len(polled) == 1
        await until_polled(2, within=1.5)
        assert len(polled) == 2
        assert polled[1] - polled[0] >= worker.wake_gap * 0.99

        worker.wake()
        await worker.get_and_submit_flow_runs()  # a tick polls before the gap has passed
        await asyncio.sleep(1.2)
        assert len(polled) == 3  # the wake was used up: no second poll

        worker._polled -= 2.0
        run_slots(worker).acquire_on_behalf_of_nowait("the last slot")
        worker.wake()  # every slot taken: nothing could be claimed
        await asyncio.sleep(0.2)
        assert len(polled) == 3
        assert worker._woken  # the next tick with a free slot polls


async def test_a_run_ending_polls_for_a_run_scheduled_while_every_slot_was_taken(
    polled: list[float],
) -> None:
    async def run(flow_run: object, configuration: object) -> None:
        await asyncio.sleep(0)

    worker = _polled_a_tick_ago(slots=1, taken=0)
    worker.run = run  # type: ignore[method-assign,assignment]
    ending, other = uuid.uuid4(), uuid.uuid4()
    async with anyio.create_task_group() as group:
        worker._runs_task_group = group
        run_slots(worker).acquire_on_behalf_of_nowait(ending)
        await worker._execute(FlowRun(id=ending, flow_id=uuid.uuid4()))
        await asyncio.sleep(0.1)
        assert polled == []  # nothing was scheduled meanwhile: no poll

        run_slots(worker).acquire_on_behalf_of_nowait(other)
        worker.wake()  # every slot taken: it stays woken
        await asyncio.sleep(0.1)
        assert polled == []
        await worker._execute(FlowRun(id=other, flow_id=uuid.uuid4()))
        await asyncio.sleep(0.1)
        assert len(polled) == 1  # the freed slot goes to it at once
