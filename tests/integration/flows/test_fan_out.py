"""A request of more chunks than CT_CHUNKS_PER_RUN delivers shares of them itself and
offers others to any worker as ``deliver-chunks`` subflow runs; the report is complete and
every device gets one."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from prefect import Task, flow, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, State, StateType, TaskRun
from prefect.states import Cancelled, Cancelling, Completed, Crashed, Running, Scheduled

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.base import PushMessage, PushResult
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.delivery.sending import RetryingSender
from campaign_trigger.flows import fan_out
from campaign_trigger.flows.deliver import deliver_chunks
from campaign_trigger.services import outcome_log, prefect_runs, request_states
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import RequestState
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    drain,
    load_request,
    read_report,
    recorded_task_runs,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]


async def _shares_of(run: FlowRun) -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])
            )
        )


async def _delivered_through_shares(
    sandbox_url: str, *, users: int, chunk_size: int
) -> tuple[FlowRun, list[FlowRun]]:
    """A send-now request of ``users`` (one device each) delivered: its run and its share
    runs, in chunk order; its report and the sandbox checked (each device once)."""
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=users, prefix=f"fan-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    request_id = add_request(
        tenant, audience.users, send_at=datetime.now(UTC), chunk_size=chunk_size
    )
    await drain()
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=120)
    assert state_name(run) == "COMPLETED", run.state
    shares = await _shares_of(run)
    rows = read_report(request_id)
    assert sorted(r["user_id"] for r in rows[tenant.android]) == sorted(audience.users)
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(d.token) for d in audience.devices] == [1] * len(audience.devices)
    return run, sorted(shares, key=lambda s: s.parameters["chunk_nos"])


def _settings(monkeypatch: pytest.MonkeyPatch, **environment: str) -> Iterator[None]:
    """The service's settings with ``environment`` for one test, then without."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield
    for name in environment:
        monkeypatch.delenv(name)
    get_settings.cache_clear()


@pytest.fixture
def four_chunks_per_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _settings(monkeypatch, CT_CHUNKS_PER_RUN="4")


async def _chunk_task_runs(run: FlowRun, shares: list[FlowRun], count: int) -> list[TaskRun]:
    """The ``deliver chunk`` task runs of the request's run and its shares, once all
    ``count`` are recorded and ended."""
    recorded = await recorded_task_runs(
        [run.id, *(s.id for s in shares)],
        lambda runs: (
            sum(1 for t in runs if t.name.startswith("deliver chunk") and t.end_time) == count
        ),
    )
    return [t for t in recorded if t.name.startswith("deliver chunk")]


def _chunk_nos(task_runs: list[TaskRun], flow_run: FlowRun) -> list[int]:
    """The chunks (from 0) whose task runs ran in ``flow_run``, in order."""
    return sorted(
        int(t.name.split()[-1].split("/")[0]) - 1 for t in task_runs if t.flow_run_id == flow_run.id
    )


async def test_a_large_request_is_delivered_through_subflow_shares(
    four_chunks_per_run: None, worker: None, sandbox_url: str
) -> None:
    # 25 messages in chunks of 3: 9 chunks, more than the 4 a run keeps for itself. The
    # request's run delivers the first share itself and offers the last as a share run,
    # which the worker claims (it has room: two chunk slots); the share between goes to
    # whichever takes it first.
    run, shares = await _delivered_through_shares(sandbox_url, users=25, chunk_size=3)
    async with get_client() as client:
        names = {(await client.read_flow(s.flow_id)).name for s in shares}
    chunks = await _chunk_task_runs(run, shares, 9)
    assert names == {"deliver-chunks"}
    assert {s.state.type.value for s in shares if s.state} == {"COMPLETED"}
    assert [s.parameters["chunk_nos"] for s in shares][-1] == [8]  # offered first
    in_shares = [_chunk_nos(chunks, s) for s in shares]
    assert in_shares == [s.parameters["chunk_nos"] for s in shares]
    own = _chunk_nos(chunks, run)
    # every chunk once, in the request's run or in one share run; whole shares each
    assert sorted(own + [c for share in in_shares for c in share]) == list(range(9))
    assert own in ([0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7])
    # A share run's only task runs are its chunks': its plan is a read, not a task run
    # (three more events for the Prefect server in every share run).
    share_ids = {s.id for s in shares}
    recorded = await recorded_task_runs([run.id, *share_ids], lambda runs: True)
    assert sorted(t.name for t in recorded if t.flow_run_id in share_ids) == sorted(
        t.name for t in chunks if t.flow_run_id in share_ids
    )


@pytest.mark.parametrize("broken", ["the request's own share", "a share run"])
async def test_a_chunk_whose_sends_broke_off_is_not_sent_again_by_its_request(
    four_chunks_per_run: None,
    worker: None,
    sandbox_url: str,
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
) -> None:
    # 25 users in chunks of 3: the request's run sends chunk 1 itself, a share run chunk
    # 9. The sends of one breaks off after its messages reached the provider, their
    # answers not recorded: the request's run sent that chunk again at its end.
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=25, prefix=f"fan-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    user = audience.users[0 if broken == "the request's own share" else -1]
    token = next(d.token for d in audience.devices if d.user_id == user)
    send_many, broke = RetryingSender.send_many, asyncio.Event()

    async def breaking_off(
        self: RetryingSender, messages: Sequence[PushMessage], **options: Any
    ) -> list[PushResult]:
        if broke.is_set() or all(m.token != token for m in messages):
            return await send_many(self, messages, **options)
        broke.set()
        await send_many(self, messages)  # sent, their answers not recorded
        raise RuntimeError("the answers could not be recorded")

    monkeypatch.setattr(RetryingSender, "send_many", breaking_off)
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC), chunk_size=3)
    await drain()
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=120)
    assert broke.is_set()
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert per_token.get(token) == 1
    assert max(per_token.get(d.token, 0) for d in audience.devices) == 1  # none twice
    assert state_name(run) == "FAILED"
    assert run.state is not None
    assert "SendsInterrupted" in (run.state.message or "")
    assert load_request(request_id).state == RequestState.failed


@pytest.fixture
def one_chunk_per_run_two_live(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _settings(monkeypatch, CT_CHUNKS_PER_RUN="1", CT_LIVE_SHARES="2")


async def test_a_request_keeps_at_most_its_live_shares_not_ended(
    one_chunk_per_run_two_live: None, worker: None, sandbox_url: str, sandbox_state: SandboxState
) -> None:
    # A gigabyte makes 513 shares: made all at once, the Prefect server's cancellation
    # service read each of them every 20 s and the request's run read a page of 200 every
    # second (the server at 0.6 of a core, against 0.27). Here 12 shares of a chunk each,
    # at most 2 share runs not yet ended at a time: the worker claims every offer (it has
    # room), so more are offered than two, each made only once an earlier one ended.
    sandbox_state.configure(latency_ms=300)  # each chunk lasts at least 0.3 s
    try:
        _, shares = await _delivered_through_shares(sandbox_url, users=24, chunk_size=2)
    finally:
        sandbox_state.configure(latency_ms=0)
    assert len(shares) > 2, [s.parameters for s in shares]
    assert all(s.end_time for s in shares), [s.state for s in shares]
    for share in shares:
        not_ended = [
            s
            for s in shares
            if s.id != share.id
            and s.created is not None
            and share.created is not None
            and s.created < share.created
            and s.end_time is not None
            and s.end_time > share.created
        ]
        assert len(not_ended) <= 1, (share.parameters, [s.parameters for s in not_ended])


@pytest.fixture
def two_chunks_per_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _settings(monkeypatch, CT_CHUNKS_PER_RUN="2")


@pytest.fixture
async def one_chunk_slot(
    two_chunks_per_run: None, deployed: object, sandbox_url: str
) -> AsyncIterator[None]:
    """A worker with one chunk slot for shares (``--chunk-concurrency 1``)."""
    from campaign_trigger.deployments.worker import run_worker

    stop = asyncio.Event()
    task = asyncio.create_task(
        run_worker(concurrency=2, chunk_concurrency=1, stop=stop, poll_seconds=0.3)
    )
    yield
    stop.set()
    await asyncio.wait_for(task, timeout=60)


async def test_a_worker_alone_makes_one_share_run_started_while_its_last_chunk_is_sent(
    one_chunk_slot: None, sandbox_url: str, sandbox_state: SandboxState
) -> None:
    # A share run costs the Prefect server what a one-message request does (~190 ms of
    # CPU): one per share was ~8 % of the chunks' time through shares. A worker alone
    # with the request, its only chunk slot busy with the request's own shares, never
    # claims the share offered until the request's run has nothing left of its own: one
    # share run, the last share, for 4 shares. It is claimed and started during the
    # request's own last chunk (the place handed on then), and its first chunk waits for
    # that chunk to end.
    sandbox_state.configure(latency_ms=700)  # each chunk lasts at least 0.7 s
    try:
        run, shares = await _delivered_through_shares(sandbox_url, users=16, chunk_size=2)
    finally:
        sandbox_state.configure(latency_ms=0)
    assert [s.parameters["chunk_nos"] for s in shares] == [[6, 7]]
    chunks = await _chunk_task_runs(run, shares, 8)
    assert _chunk_nos(chunks, run) == list(range(6))
    spans = sorted((t.start_time, t.end_time) for t in chunks if t.start_time and t.end_time)
    assert len(spans) == 8, chunks
    for (_, end), (start, _) in itertools.pairwise(spans):  # one slot: one chunk at a time
        assert end <= start, spans
    own_last = next(t for t in chunks if t.name == "deliver chunk 6/8")
    share_start = shares[0].start_time
    assert own_last.start_time is not None
    assert own_last.end_time is not None
    assert share_start is not None
    assert own_last.start_time < share_start < own_last.end_time, (own_last, share_start)


@flow(name="fan-out-share-probe")
def _share_probe() -> None:
    """A stand-in flow for shares whose states the test sets."""


async def test_every_live_share_is_read_past_a_page_of_flow_runs(prefect_server: object) -> None:
    # A gigabyte (25.6 M recipients) makes 513 shares; Prefect answers at most 200 runs a read.
    count = prefect_runs.PAGE_LIMIT + 1
    async with get_client() as client:
        runs = [await client.create_flow_run(_share_probe, state=Completed()) for _ in range(count)]
        last = runs[-1].id  # on the second page
        await client.set_flow_run_state(last, Running(), force=True)
        assert list(await fan_out._not_ended([r.id for r in runs])) == [last]
        await client.set_flow_run_state(last, Completed(), force=True)
        assert await fan_out._not_ended([r.id for r in runs]) == {}
        dead: State[None] = Crashed(message=prefect_runs.DEAD_RUN_MESSAGE)  # about to be taken over
        await client.set_flow_run_state(last, dead, force=True)
        assert list(await fan_out._not_ended([r.id for r in runs])) == [last]
        await client.set_flow_run_state(last, Scheduled(), force=True)  # an offer not claimed
        assert await fan_out._not_ended([r.id for r in runs]) == {last: True}


@flow(name="fan-out-share-probe-chunks")
def _share_probe_of(chunk_nos: list[int]) -> None:
    """A stand-in for a share run, under a stand-in for a request's run."""


async def test_a_taken_over_request_finds_every_share_run_it_made_past_a_page(
    prefect_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefect_runs, "PAGE_LIMIT", 2)  # three share runs: two pages
    async with get_client() as client:
        request_run = await client.create_flow_run(_share_probe, state=Running())
        made = {}
        for first in (0, 4, 8):
            parent = await client.create_task_run(
                Task(fn=lambda: None, name="deliver-chunks/default"),
                flow_run_id=request_run.id,
                dynamic_key=str(first),
            )
            share = await client.create_flow_run(
                _share_probe_of,
                parameters={"chunk_nos": [first, first + 1]},
                parent_task_run_id=parent.id,
            )
            made[first] = share.id
        other = await client.create_flow_run(_share_probe, state=Running())
    assert await fan_out._shares_made(request_run.id) == made
    assert await fan_out._shares_made(other.id) == {}
    assert await fan_out._shares_made(None) == {}


async def test_a_share_ending_on_its_own_as_its_request_is_cancelled_stays_cancelled(
    prefect_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cancel marks the request cancelled, then reads its live shares and sets each
    # Cancelling. A share running meanwhile sees its request cancelled and ends Cancelled
    # on its own; landing between that read and that write, its end was overwritten
    # (forced) with Cancelling, which no worker then ended: its run had finished.
    async with get_client() as client:
        request_run = await client.create_flow_run(_share_probe, state=Running())
        parent = await client.create_task_run(
            Task(fn=lambda: None, name="deliver-chunks/default"),
            flow_run_id=request_run.id,
            dynamic_key="0",
        )
        share = await client.create_flow_run(
            _share_probe_of, parameters={"chunk_nos": [0]}, parent_task_run_id=parent.id
        )
        await client.set_flow_run_state(share.id, Running(), force=True)
        read = client.read_flow_runs

        async def read_then_the_share_ends(**filters: Any) -> list[FlowRun]:
            found = await read(**filters)
            if found:
                monkeypatch.setattr(client, "read_flow_runs", read)
                ended: State[None] = Cancelled(message="The request was cancelled")
                await client.set_flow_run_state(share.id, ended)
            return found

        monkeypatch.setattr(client, "read_flow_runs", read_then_the_share_ends)
        await prefect_runs.cancel_shares(client, request_run.id)
        after = await client.read_flow_run(share.id)
    assert after.state is not None
    assert (after.state.type, after.state.message) == (
        StateType.CANCELLED,
        "The request was cancelled",
    )


async def _running_share(run: FlowRun) -> FlowRun | None:
    return next((s for s in await _shares_of(run) if state_name(s) == "RUNNING"), None)


@pytest.mark.parametrize("cancelled", ["request", "share"])
async def test_a_request_cancelled_while_running_sends_nothing_more_through_its_shares(
    one_chunk_per_run_two_live: None,
    worker: None,
    sandbox_url: str,
    sandbox_state: SandboxState,
    cancelled: str,
) -> None:
    # Cancelled in the UI while it delivers, with share runs made (the request's run, or
    # one of its share runs: a request is cancelled as a whole): every share ends with it,
    # and nobody sends another message of it. Unfenced, a share offered and not yet
    # claimed stayed Scheduled (Prefect's own clean-up of a cancelled run's subflows looks
    # every 20 s) and the worker, its slots freed by the cancel, claimed it and sent its
    # chunks: a cancelled request went on being delivered. A share cancelled on its own
    # marked the request cancelled, and its run went on and sent that share's chunks too.
    # 24 chunks of 2, each at least 1 s, two at a time: 12 s of them, more than the cancel
    # watch's 10 s between looks when no event wakes it (a Cancelling event may reach the
    # worker before the server shows the state), so the cancel lands before the request's
    # end. With 12 chunks, and with 24 of 0.5 s, on a slow machine (CI, 2 and 3 Dec) the
    # request had sent its last chunk and completed first.
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=48, prefix=f"stop-{uuid.uuid4().hex[:6]}")
    audience.devices = [d for d in audience.devices if d.app_id == tenant.android]
    add_devices(audience.devices)
    tokens = [d.token for d in audience.devices]
    sandbox_state.configure(latency_ms=1000)  # each chunk of 2 lasts at least 1 s
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC), chunk_size=2)
        await drain()
        run = await wait_for_state(request_id, "RUNNING", timeout=30)
        async with asyncio.timeout(30):
            if cancelled == "request":  # once shares are made: offered, maybe claimed
                while not await _shares_of(run):
                    await asyncio.sleep(0.1)
                target = run
            else:
                while (share := await _running_share(run)) is None:
                    await asyncio.sleep(0.1)
                target = share
        ended = {s.id for s in await _shares_of(run) if s.state and s.state.is_final()}
        cancel: State[None] = Cancelling()
        async with get_client() as client:
            await client.set_flow_run_state(target.id, cancel)
        run = await wait_for_state(request_id, "CANCELLED", "COMPLETED", timeout=30)
        assert state_name(run) == "CANCELLED"

        def stopped(share: FlowRun) -> bool:
            # Cancelled; or, started before the cancel, Completed: its one chunk's
            # messages were in flight and their answers came before the stop reached it.
            started = share.start_time is not None and share.start_time < cancel.timestamp
            return state_name(share) == "CANCELLED" or (
                started and state_name(share) == "COMPLETED"
            )

        # Every share not ended at the cancel ends so (one that was running shows Crashed
        # for a moment: Prefect's engine, stopped, says so before the worker sets it
        # Cancelled), well within Prefect's own 20 s. On a slow machine (CI, 3 Dec) the
        # only share left was one in flight, which completed its chunk before the stop
        # reached it: none Cancelled, and nothing sent after (below) all the same.
        deadline = time.monotonic() + 10
        while True:
            left = [s for s in await _shares_of(run) if s.id not in ended]
            if left and all(map(stopped, left)):
                break
            assert time.monotonic() < deadline, [(s.state, s.start_time) for s in left]
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)  # the answers of messages in flight at the stop land
        sent = sandbox_stats(sandbox_url)["per_token"]
        await asyncio.sleep(3.0)  # a share left scheduled would be found due and claimed
        again = sandbox_stats(sandbox_url)["per_token"]
    finally:
        sandbox_state.configure(latency_ms=0)
    assert [again.get(t, 0) for t in tokens] == [sent.get(t, 0) for t in tokens]
    assert sum(again.get(t, 0) for t in tokens) < len(tokens)  # stopped before its end
    assert load_request(request_id).state == RequestState.canceled


def _ended(run: FlowRun) -> bool:
    return run.state is not None and run.state.is_final()


@pytest.fixture
def four_chunks_per_run_two_live(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _settings(monkeypatch, CT_CHUNKS_PER_RUN="4", CT_LIVE_SHARES="2")


async def test_a_share_running_as_its_request_is_cancelled_starts_no_further_chunk(
    four_chunks_per_run_two_live: None,
    worker: None,
    sandbox_url: str,
    sandbox_state: SandboxState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cancelled in the UI: the request's run is stopped and its request marked canceled,
    # then its share runs are set Cancelling, and each reaches its worker as an event,
    # seconds later (or at the cancel watch's next look, 10 s, if the event is missed).
    # Here that Cancelling never comes (held back): a share running at the cancel ends
    # its chunk and starts no other. It used to send all of its chunks.
    async def held_back(client: object, flow_run_id: object) -> None:
        return None

    monkeypatch.setattr(prefect_runs, "cancel_shares", held_back)
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=48, prefix=f"held-{uuid.uuid4().hex[:6]}")
    audience.devices = [d for d in audience.devices if d.app_id == tenant.android]
    add_devices(audience.devices)
    tokens = [d.token for d in audience.devices]
    sandbox_state.configure(latency_ms=500)  # 24 chunks of 2, 4 a share: 2 s a share
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC), chunk_size=2)
        await drain()
        run = await wait_for_state(request_id, "RUNNING", timeout=30)
        async with asyncio.timeout(30):
            while (share := await _running_share(run)) is None:
                await asyncio.sleep(0.05)
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling())
            run = await wait_for_state(request_id, "CANCELLED", "COMPLETED", timeout=30)
            assert state_name(run) == "CANCELLED"
            async with asyncio.timeout(10):
                while not _ended(share := await client.read_flow_run(share.id)):
                    await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # the answers of messages in flight at the stop land
        sent = sandbox_stats(sandbox_url)["per_token"]
        await asyncio.sleep(2.0)
        again = sandbox_stats(sandbox_url)["per_token"]
    finally:
        sandbox_state.configure(latency_ms=0)
    assert state_name(share) == "CANCELLED"
    with session_scope() as session:
        recorded = outcome_log.recorded_chunks(session=session, request_id=request_id)
    assert len(recorded & set(share.parameters["chunk_nos"])) < 4
    assert [again.get(t, 0) for t in tokens] == [sent.get(t, 0) for t in tokens]
    assert max(again.get(t, 0) for t in tokens) == 1


async def test_a_share_of_a_cancelled_request_sends_nothing(
    deployed: object, sandbox_url: str
) -> None:
    # A share claimed between its request's cancel and the end of its share runs (above)
    # ends Cancelled without a send.
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=4, prefix=f"gone-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC), chunk_size=2)
    with session_scope() as session:
        request_states.set_state(
            session=session, request_id=request_id, state=RequestState.canceled
        )
        session.commit()
    ended = await deliver_chunks.fn(request_id, [1])
    assert isinstance(ended, State), ended
    assert ended.type == StateType.CANCELLED
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(d.token, 0) for d in audience.devices] == [0] * len(audience.devices)
