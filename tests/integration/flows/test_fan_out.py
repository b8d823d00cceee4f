"""A request of more chunks than CT_CHUNKS_PER_RUN hands shares of them to any worker as
``deliver-chunks`` subflow runs; the report is complete and every device gets one."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from prefect import flow, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.states import Completed, Crashed, Running

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.flows import fan_out
from campaign_trigger.services import prefect_runs
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    drain,
    read_report,
    recorded_task_runs,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]


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
    async with get_client() as client:
        shares = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])
            )
        )
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


async def test_a_large_request_is_delivered_through_subflow_shares(
    four_chunks_per_run: None, worker: None, sandbox_url: str
) -> None:
    # 25 messages in chunks of 3: 9 chunks, more than the 4 a run keeps for itself. The
    # request's run delivers the first share itself; the others are share runs.
    run, shares = await _delivered_through_shares(sandbox_url, users=25, chunk_size=3)
    async with get_client() as client:
        names = {(await client.read_flow(s.flow_id)).name for s in shares}
    recorded = await recorded_task_runs(
        [run.id, *(s.id for s in shares)],
        lambda runs: sum(1 for t in runs if t.name.startswith("deliver chunk")) == 9,
    )
    chunk_runs = [
        sorted(
            (
                t.name
                for t in recorded
                if t.flow_run_id == r.id and t.name.startswith("deliver chunk")
            ),
            key=lambda name: int(name.split()[-1].split("/")[0]),
        )
        for r in (run, *shares)
    ]
    assert names == {"deliver-chunks"}
    assert [s.parameters["chunk_nos"] for s in shares] == [[4, 5, 6, 7], [8]]
    assert {s.state.type.value for s in shares if s.state} == {"COMPLETED"}
    assert chunk_runs == [
        [f"deliver chunk {k}/9" for k in range(1, 5)],
        [f"deliver chunk {k}/9" for k in range(5, 9)],
        ["deliver chunk 9/9"],
    ]
    # A share run's only task runs are its chunks': its plan is a read, not a task run
    # (three more events for the Prefect server in every share run).
    share_ids = {s.id for s in shares}
    assert sorted(t.name for t in recorded if t.flow_run_id in share_ids) == sorted(
        f"deliver chunk {k}/9" for k in range(5, 10)
    )


@pytest.fixture
def one_chunk_per_run_two_live(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _settings(monkeypatch, CT_CHUNKS_PER_RUN="1", CT_LIVE_SHARES="2")


async def test_a_request_keeps_at_most_its_live_shares_not_ended(
    one_chunk_per_run_two_live: None, worker: None, sandbox_url: str
) -> None:
    # A gigabyte makes 513 shares: made all at once, the Prefect server's cancellation
    # service read each of them every 20 s and the request's run read a page of 200 every
    # second (the server at 0.6 of a core, against 0.27). Here 6 shares, the request's own
    # and 5 share runs, at most 2 not yet ended at a time.
    _, shares = await _delivered_through_shares(sandbox_url, users=12, chunk_size=2)
    assert [s.parameters["chunk_nos"] for s in shares] == [[k] for k in range(1, 6)]
    ends = [s.end_time for s in shares]
    assert all(ends), [s.state for s in shares]
    for k, share in enumerate(shares[2:], start=2):
        # made only once all but one of the shares before it had ended
        ended_before = sum(1 for end in ends[:k] if end is not None and end <= share.created)
        assert ended_before >= k - 1, (k, share.created, ends)


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


async def test_the_next_share_starts_while_the_last_chunk_of_the_one_before_is_sent(
    one_chunk_slot: None, sandbox_url: str, sandbox_state: SandboxState
) -> None:
    # Each handover between two shares left the only chunk slot idle ~0.5 s (the run's
    # end, the next claim, its start, its plan): 15 % over 40 chunks of 5,000. A share
    # on its last chunk now hands its slot on: the next share is claimed and started
    # meanwhile, and its first chunk waits for that chunk to end.
    # The request's own first share holds the slot for its chunks too.
    sandbox_state.configure(latency_ms=700)  # each chunk lasts at least 0.7 s
    try:
        run, shares = await _delivered_through_shares(sandbox_url, users=16, chunk_size=2)
    finally:
        sandbox_state.configure(latency_ms=0)
    assert [s.parameters["chunk_nos"] for s in shares] == [[2, 3], [4, 5], [6, 7]]
    ends = [s.end_time for s in shares]
    starts = [s.start_time for s in shares]
    assert all(ends), ends
    assert all(starts), starts
    for end, start in zip(ends, starts[1:], strict=False):  # the next began before it ended
        assert start < end, (starts, ends)
    recorded = await recorded_task_runs(
        [run.id, *(s.id for s in shares)],
        lambda runs: sum(1 for t in runs if t.name.startswith("deliver chunk") and t.end_time) == 8,
    )
    chunks = [t for t in recorded if t.name.startswith("deliver chunk")]
    spans = sorted((t.start_time, t.end_time) for t in chunks if t.start_time and t.end_time)
    assert len(spans) == 8, chunks
    for (_, end), (start, _) in itertools.pairwise(spans):  # one slot: one chunk at a time
        assert end <= start, spans
    # The request's own share held the worker's only place in its chunks queue, as a
    # share run does: the first share run was claimed and started during its last chunk,
    # not held from other workers while its first chunk was sent.
    own_last = next(t for t in chunks if t.name == "deliver chunk 2/8")
    assert own_last.start_time is not None
    assert own_last.start_time < starts[0], (own_last.start_time, starts)


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
        assert await fan_out._still_running([r.id for r in runs]) == [last]
        await client.set_flow_run_state(last, Completed(), force=True)
        assert await fan_out._still_running([r.id for r in runs]) == []
        dead = Crashed(message=prefect_runs.DEAD_RUN_MESSAGE)  # about to be taken over
        await client.set_flow_run_state(last, dead, force=True)
        assert await fan_out._still_running([r.id for r in runs]) == [last]
