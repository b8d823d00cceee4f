"""Handing a large request's chunks to every delivery worker: ``deliver-chunks`` subflows.

A request of more than ``CT_CHUNKS_PER_RUN`` chunks is cut into shares of that many.
The request's run delivers shares itself, from the first on, from the moment it is
prepared; meanwhile it offers shares from the last one back as flow runs of
``deliver-chunks/default`` in the pool's ``chunks`` queue, created as subflows of the
request's run (the UI shows them under the request), which any worker process with
room on any machine claims and runs. One offer waits at first; at each look one more
is kept waiting than were claimed since the last, so a worker alone with the request
makes one share run, not one per share, and every worker with room takes part. At
most ``CT_LIVE_SHARES`` share runs are not yet ended at a time. The request's run then
waits for them, updating its progress artifact from the recorded chunks, and delivers
whatever is still missing itself (a share that failed for good), so the report is
always complete; unless a share's sends broke off (``SendsInterrupted``): its messages in
flight may have gone without their answers recorded, so the request fails instead.
Shares are cut from all of the request's chunks, never from the ones still missing, and
are idempotent (key: request and first chunk): a taken-over request's run finds the very
share runs it made, some maybe still running on other workers, and leaves them be.
Chunks record every answer, so a share taken over after its worker died resumes where
that worker stopped.

In a worker process, shares (the request's own too) deliver their chunks through
:class:`ShareSlots`: at most ``--chunk-concurrency`` chunks at a time, and a share run on
its last chunk hands its place on, so the next share is claimed and started while that
chunk is sent. The request's own shares take a place in the worker's chunks queue as a
share run does, so the worker claims one share fewer while they are sent and leaves that
share to a worker with room; they hand it on at their last chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Protocol
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.context import FlowRunContext
from prefect.deployments.flow_runs import arun_deployment

from campaign_trigger.services import delivering, prefect_runs
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import recorded_chunk_count, recorded_chunks

logger = logging.getLogger(__name__)

# Once the request's run has sent its own shares, the recorded chunks (a count in the
# service's database) are looked at as each chunk of the request ends in this process
# (a share run beside it: the request notices its last chunk at once) and every
# RECORDED_SECONDS for the chunks sent elsewhere (counted every 0.2 s instead, a query in
# a thread five times a second, the chunks of the last share, which a lone worker sends
# beside it, took ~5 points longer than the others: docs/benchmarks.md); before, they
# cannot all be recorded, so they are counted only as the progress bar is shown, every
# WAIT_SECONDS. The live shares' runs are read (a call to the Prefect server) every
# WAIT_SECONDS while shares are left to offer and workers claim them, so a claimed offer
# or an ended share is replaced within that; twice as long after each read that found
# offers and none claimed (the workers are busy), up to ENDED_SECONDS; once every share
# is taken or offered, only to notice a share that ended without all of its chunks (it
# failed for good: the request delivers them itself), every ENDED_SECONDS.
RECORDED_SECONDS = 1.0
WAIT_SECONDS = 1.0
ENDED_SECONDS = 5.0


_chunk_ends: dict[str, asyncio.Event] = {}  # the requests whose run waits, by id


def chunk_ended(request_id: str) -> None:
    """A chunk of the request ended (and is recorded) in this process: the request's run,
    if it waits for its shares here, counts its chunks at once."""
    if (ended := _chunk_ends.get(request_id)) is not None:
        ended.set()


async def _next_chunk_end(ended: asyncio.Event) -> None:
    """Until a chunk of the request ends in this process, or RECORDED_SECONDS."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ended.wait(), RECORDED_SECONDS)
    ended.clear()


class ChunksQueue(Protocol):
    """A worker's chunks queue, as the shares it runs see it: each share holds a place in
    it (a claimed share run holds one from its claim to its end)."""

    def hand_on(self, run_id: UUID) -> None:
        """Free ``run_id``'s place now and claim the next share at once."""

    def hold_place(self, run_id: UUID) -> None:
        """Take a place for ``run_id`` (a share not claimed from the queue), if one is free."""

    def free_place(self, run_id: UUID) -> None:
        """Free ``run_id``'s place, if it holds one."""


class ShareSlots:
    """A worker process's chunk slots for the shares it runs (``--chunk-concurrency``).

    Each chunk of a share is delivered holding one of ``size`` slots. A share starting
    its last chunk hands its place in the chunks queue on: the worker claims the next
    share at once, so that share's claim, start and plan happen while the chunk is sent,
    and its first chunk takes the slot the moment the chunk ends. Without it each share
    handover left the slot idle 0.2-0.5 s (docs/benchmarks.md, per-chunk overhead through
    shares). A share claimed ahead waits at most one chunk, so it is never held from an
    idle worker for long.

    A request's own shares are not claimed from the queue: :meth:`own_share` takes a
    place for them, as a claimed share run holds one. Without that place, a worker whose
    slots the request's own shares were filling claimed the share offered at once, and
    held it, waiting for a slot, from workers that had room for the whole share.
    """

    def __init__(self, size: int, queue: ChunksQueue) -> None:
        self._free = asyncio.Semaphore(size)
        self._queue = queue

    @contextlib.contextmanager
    def own_share(self, run_id: UUID) -> Iterator[None]:
        """While the request's run ``run_id`` delivers its own shares: a place in the chunks
        queue if one is free (handed on at their last chunk, else freed at their end)."""
        self._queue.hold_place(run_id)
        try:
            yield
        finally:
            self._queue.free_place(run_id)

    @contextlib.asynccontextmanager
    async def chunk(self, share_run: UUID, *, last: bool) -> AsyncIterator[None]:
        """Hold a slot while one chunk of the share of ``share_run`` (a share run, or the
        request's run for its own shares) is delivered."""
        async with self._free:
            if last:
                self._queue.hand_on(share_run)
            yield


# Set by a worker process while it serves shares; None elsewhere (a share run from
# Python delivers its chunks one after another, with no other share to wait for).
share_slots: ShareSlots | None = None


def shares(chunks: Sequence[int], per_run: int) -> list[list[int]]:
    """The chunks in runs of ``per_run``, in order."""
    return [list(chunks[start : start + per_run]) for start in range(0, len(chunks), per_run)]


async def _start_share(plan: DeliveryPlan, share: list[int]) -> UUID:
    """The share's run (created, or found by its key)."""
    run = await arun_deployment(
        prefect_runs.CHUNKS_DEPLOYMENT_FULL_NAME,
        parameters={"request_id": plan.request_id, "chunk_nos": share},
        flow_run_name=f"{plan.request_id} chunks {share[0] + 1}-{share[-1] + 1}",
        timeout=0,
        idempotency_key=f"{plan.request_id}:chunks:{share[0]}",
        tags=[f"request:{plan.request_id}"],
    )
    return run.id


async def _shares_made(run_id: UUID | None) -> dict[int, UUID]:
    """The share runs the request's run ``run_id`` made (before it was taken over, if it
    was), by their first chunk; none outside a flow run."""
    return {r.parameters["chunk_nos"][0]: r.id for r in await _share_runs(run_id)}


def _run_id() -> UUID | None:
    """The flow run this runs in (the request's), if any."""
    context = FlowRunContext.get()
    return context.flow_run.id if context and context.flow_run else None


async def _share_runs(run_id: UUID | None) -> list[FlowRun]:
    """The share runs the request's run ``run_id`` made, read a page at a time."""
    if run_id is None:
        return []
    page = prefect_runs.PAGE_LIMIT
    made: list[FlowRun] = []
    async with get_client() as client:
        while True:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])
                ),
                limit=page,
                offset=len(made),
            )
            made.extend(runs)
            if len(runs) < page:
                return made


def _broke_off(run: FlowRun) -> bool:
    """Whether the share run failed as a chunk's sends broke off (``SendsInterrupted``,
    named in the message of the Failed state Prefect's engine gave the run)."""
    state = run.state
    return (
        state is not None
        and state.type == StateType.FAILED
        and f"{delivering.SendsInterrupted.__name__}:" in (state.message or "")
    )


async def _not_ended(run_ids: list[UUID]) -> dict[UUID, bool]:
    """Those of ``run_ids`` that have not ended, each with whether no worker has claimed
    it yet (Scheduled); read a page at a time (Prefect refuses a larger one)."""
    page = prefect_runs.PAGE_LIMIT
    running: dict[UUID, bool] = {}
    async with get_client() as client:
        for start in range(0, len(run_ids), page):
            ids = run_ids[start : start + page]
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids)
            )
            running.update(
                (r.id, r.state is not None and r.state.type == StateType.SCHEDULED)
                for r in runs
                if r.state is None or not r.state.is_final() or _dead(r.state.message)
            )
    return running


def _dead(message: str | None) -> bool:
    """A share marked dead is not over: a worker is about to take it over."""
    return message == prefect_runs.DEAD_RUN_MESSAGE


def _local_chunks(
    first: list[int] | None, left: collections.deque[list[int]], recorded: AbstractSet[int]
) -> Generator[tuple[int, bool]]:
    """The chunks the request's run delivers itself, each with whether it is the last:
    ``first``, then share after share from the front of ``left`` (the shares not made).
    The next share is taken from ``left`` as the last chunk of one starts, so it is never
    offered to other workers meanwhile, and a chunk is the last only if none is left.
    Closed early (a chunk failed), it puts the share it took but did not begin back."""
    share = first
    following = None
    try:
        while share is not None:
            todo = [n for n in share if n not in recorded]
            following = None
            if not todo:
                following = left.popleft() if left else None
            for k, chunk_no in enumerate(todo, start=1):
                if k == len(todo):
                    following = left.popleft() if left else None
                yield chunk_no, k == len(todo) and following is None
            share = following
    except GeneratorExit:
        if following is not None:
            left.appendleft(following)
        raise


async def _here(
    deliver_here: Callable[[Iterator[tuple[int, bool]]], Awaitable[None]],
    chunks: Generator[tuple[int, bool]],
    plan: DeliveryPlan,
) -> None:
    """The shares the request's run delivers itself. A chunk that fails for good ends
    them, not the request: its chunks are delivered again once every share has ended,
    and the shares not begun are offered to the workers, while the share runs go on. A
    chunk whose sends broke off is not delivered again (its messages in flight would go
    twice): the request fails once every share has ended."""
    try:
        await deliver_here(chunks)
    except delivering.SendsInterrupted:
        chunks.close()  # the shares not begun go to the workers; the request then fails
        raise
    except Exception:
        chunks.close()
        logger.exception("request %s: its own shares failed; retried at the end", plan.request_id)


async def fan_out(
    plan: DeliveryPlan,
    *,
    per_run: int,
    live: int,
    deliver_here: Callable[[Iterator[tuple[int, bool]]], Awaitable[None]],
) -> set[int]:
    """Deliver the request's chunks: shares from the front with ``deliver_here`` (in the
    request's run), shares from the back through share runs that other workers claim;
    returns the chunks still missing once every share has ended.

    The request's run starts its first share at once, not after a share run is made,
    claimed, started and has read the plan (0.2-0.5 s). Share runs are offered from the
    last share back, one at first: a worker with room claims the offer, and at each look
    one more offer is kept waiting than were claimed since the last, so as many workers
    take part as have room; an offer nobody claims waits while the request's run
    goes on with the shares in front of it. So a worker alone with the request delivers
    all but one share in the request's own run, each share run costing the Prefect
    server as much as a one-message request (docs/benchmarks.md), and several workers
    each take shares as soon as they have room. At most ``live`` share runs are not yet
    ended at a time, so what the Prefect server does each second for the request (its
    reads of the shares, its cancellation service's look at every subflow not yet
    ended) is that of ``live`` shares, not of all of a gigabyte's 513.

    A taken-over request's run finds the share runs its predecessor made (they may still
    run elsewhere) and leaves them be; the shares it finds not made it takes or offers
    again, from what is recorded of them.
    """
    made = await _shares_made(_run_id())
    left = collections.deque(
        share
        for share in shares(range(plan.chunk_count), per_run)
        if share[0] not in made and not plan.recorded.issuperset(share)
    )
    running = await _not_ended(list(made.values())) if made else {}
    first = left.popleft() if left else None
    # Taken before the first share run is made: the run's place in its worker's chunks
    # queue is held before that worker could claim the share run.
    here = asyncio.create_task(_here(deliver_here, _local_chunks(first, left, plan.recorded), plan))

    async def offer(claimed: int) -> None:  # popped from the end: the last share first
        while left and len(running) < live and sum(running.values()) <= claimed:
            running[await _start_share(plan, left.pop())] = True

    ended = _chunk_ends[plan.request_id] = asyncio.Event()
    try:
        await offer(0)
        progress = artifacts.Progress(chunk_count=plan.chunk_count, done=len(plan.recorded))
        # the runs were just made or read: the first read is one interval on
        show_at = time.monotonic() + WAIT_SECONDS
        read_at = time.monotonic() + (WAIT_SECONDS if left else ENDED_SECONDS)
        unclaimed_reads = 0  # reads in a row that found offers and none claimed
        while True:
            done = await recorded_chunk_count(plan.request_id)
            if done >= plan.chunk_count:
                break
            now = time.monotonic()
            if now >= show_at:
                progress.show(done)
                show_at = now + WAIT_SECONDS
            if now >= read_at:
                offered = [run_id for run_id, unclaimed in running.items() if unclaimed]
                running = await _not_ended(list(running))
                claimed = sum(1 for run_id in offered if not running.get(run_id))
                await offer(claimed)
                if not running and not left and here.done():
                    break
                unclaimed_reads = unclaimed_reads + 1 if offered and not claimed else 0
                pace = WAIT_SECONDS * 2**unclaimed_reads if left else ENDED_SECONDS
                read_at = now + min(pace, ENDED_SECONDS)
            if here.done():
                await _next_chunk_end(ended)
            else:  # the request cannot end before its own chunks: no count until then
                await asyncio.wait({here}, timeout=min(show_at, read_at) - time.monotonic())
        await here  # its last chunk's task run ends after the chunk is recorded
    except Exception:
        await here  # the request fails (share runs not made): its own chunks end first
        raise
    finally:
        here.cancel()  # a no-op once it ended; else the request's run is being stopped
        if _chunk_ends.get(plan.request_id) is ended:
            del _chunk_ends[plan.request_id]
    progress.show(done)
    await progress.close()
    missing = set(range(plan.chunk_count)) - await recorded_chunks(plan.request_id)
    if missing and (broken := [r for r in await _share_runs(_run_id()) if _broke_off(r)]):
        raise delivering.SendsInterrupted(
            f"request {plan.request_id}: the sends of share run {broken[0].name} broke off; "
            "its chunks are not sent again, so that no message in flight goes twice"
        )
    return missing
