"""Handing a large request's chunks to every delivery worker: ``deliver-chunks`` subflows.

A request of more than ``CT_CHUNKS_PER_RUN`` chunks is cut into shares of that many.
The request's run delivers the first share itself, from the moment it is prepared; each
other share is a flow run of ``deliver-chunks/default`` in the pool's ``chunks`` queue,
created as a subflow of the request's run (the UI shows it under the request), which
any worker process on any machine claims and runs; at most ``CT_LIVE_SHARES`` of them
are not yet ended at a time, the next created as one ends. The request's run waits for them,
updating its progress artifact from the recorded chunks, then delivers whatever is
still missing itself (a share that failed for good), so the report is always complete.
Shares are cut from all of the request's chunks, never from the ones still missing, and
are idempotent (key: request and first chunk): a taken-over request's run finds the very
shares it made, some maybe still running on other workers, instead of making new ones
that would overlap them. Chunks record every answer, so a share taken over after its
worker died resumes where that worker stopped.

In a worker process, shares (the request's own first one too) deliver their chunks
through :class:`ShareSlots`: at most ``--chunk-concurrency`` chunks at a time, and a share
on its last chunk hands its place on, so the next share is claimed and started while
that chunk is sent. The request's own share takes a place in the worker's chunks queue
as a share run does, so the worker claims one share fewer while it is sent and leaves
that share to a worker with room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Protocol
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments.flow_runs import arun_deployment

from campaign_trigger.services import prefect_runs
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import recorded_chunk_count, recorded_chunks

logger = logging.getLogger(__name__)

# The recorded chunks (a count in the service's database) are looked at every
# RECORDED_SECONDS: the request notices its last chunk within that; the progress bar is
# shown every WAIT_SECONDS, and so are the live shares' runs read (a call to the Prefect
# server) while shares wait to be made, so an ended one is replaced within that. Once
# every share is made the runs are read only to notice a share that ended without all
# of its chunks (it failed for good: the request delivers them itself), every
# ENDED_SECONDS.
RECORDED_SECONDS = 0.2
WAIT_SECONDS = 1.0
ENDED_SECONDS = 5.0


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

    A request's own first share is not claimed from the queue: :meth:`own_share` takes a
    place for it, as a claimed share run holds one. Without that place, a worker whose
    slots the request's own share was filling claimed the next share at once, and held
    it, waiting for a slot, from workers that had room for the whole share.
    """

    def __init__(self, size: int, queue: ChunksQueue) -> None:
        self._free = asyncio.Semaphore(size)
        self._queue = queue

    @contextlib.contextmanager
    def own_share(self, run_id: UUID) -> Iterator[None]:
        """While the request's run ``run_id`` delivers its own share: a place in the chunks
        queue if one is free (handed on at its last chunk, else freed at its end)."""
        self._queue.hold_place(run_id)
        try:
            yield
        finally:
            self._queue.free_place(run_id)

    @contextlib.asynccontextmanager
    async def chunk(self, share_run: UUID, *, last: bool) -> AsyncIterator[None]:
        """Hold a slot while one chunk of the share of ``share_run`` (a share run, or the
        request's run for its own share) is delivered."""
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


async def _still_running(run_ids: list[UUID]) -> list[UUID]:
    """Those of ``run_ids`` that have not ended, read a page at a time (Prefect refuses a
    larger one)."""
    page = prefect_runs.PAGE_LIMIT
    running: list[UUID] = []
    async with get_client() as client:
        for start in range(0, len(run_ids), page):
            ids = run_ids[start : start + page]
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids)
            )
            running += [
                r.id
                for r in runs
                if r.state is None or not r.state.is_final() or _dead(r.state.message)
            ]
    return running


def _dead(message: str | None) -> bool:
    """A share marked dead is not over: a worker is about to take it over."""
    return message == prefect_runs.DEAD_RUN_MESSAGE


async def _first_share(
    deliver_here: Callable[[list[int]], Awaitable[None]], share: list[int], plan: DeliveryPlan
) -> None:
    """The request's own share, what of it is not recorded yet. A chunk that fails for good
    fails the share, not the request: like a failed share run's, its chunks are delivered
    again once every share has ended, while the share runs go on."""
    try:
        await deliver_here([n for n in share if n not in plan.recorded])
    except Exception:
        logger.exception("request %s: its own share failed; retried at the end", plan.request_id)


async def fan_out(
    plan: DeliveryPlan,
    *,
    per_run: int,
    live: int,
    deliver_here: Callable[[list[int]], Awaitable[None]],
) -> set[int]:
    """Deliver the request's chunks: the first share with ``deliver_here`` (in the
    request's run), the others through share runs on any worker; returns the chunks still
    missing once every share has ended.

    The first share needs no run: its chunks start as soon as the request is prepared,
    not after a share run is made, claimed, started and has read the plan (0.2-0.5 s),
    and the other shares are made meanwhile. At most ``live`` share runs are not yet
    ended at a time: the next is made when one ends, so what the Prefect server does each
    second for the request (its reads of the shares, its cancellation service's look at
    every subflow not yet ended) is that of ``live`` shares, not of all of a gigabyte's
    513.
    """
    own, *others = shares(range(plan.chunk_count), per_run)
    here = asyncio.create_task(_first_share(deliver_here, own, plan))
    waiting = [share for share in reversed(others) if not plan.recorded.issuperset(share)]
    running: list[UUID] = []

    async def top_up() -> None:  # popped from the end: in chunk order
        while waiting and len(running) < live:
            running.append(await _start_share(plan, waiting.pop()))

    try:
        await top_up()
        progress = artifacts.Progress(chunk_count=plan.chunk_count, done=len(plan.recorded))
        every = round(WAIT_SECONDS / RECORDED_SECONDS)  # looks per progress update
        looks = 0
        while True:
            done = await recorded_chunk_count(plan.request_id)
            if done >= plan.chunk_count:
                break
            looks += 1  # the runs were just made or read: the first read is one interval on
            if looks % every == 0:
                progress.show(done)
            pace = WAIT_SECONDS if waiting else ENDED_SECONDS
            if looks % round(pace / RECORDED_SECONDS) == 0:
                running = await _still_running(running)
                await top_up()
                if not running and here.done():
                    break
            await asyncio.sleep(RECORDED_SECONDS)
        await here  # its last chunk's task run ends after the chunk is recorded
    except Exception:
        await here  # the request fails (share runs not made): its own chunks end first
        raise
    finally:
        here.cancel()  # a no-op once it ended; else the request's run is being stopped
    progress.show(done)
    await progress.close()
    return set(range(plan.chunk_count)) - await recorded_chunks(plan.request_id)
