"""Handing a large request's chunks to every delivery worker: ``deliver-chunks`` subflows.

A request of more than ``CT_CHUNKS_PER_RUN`` chunks is cut into shares of that many;
each share is a flow run of ``deliver-chunks/default`` in the pool's ``chunks`` queue,
created as a subflow of the request's run (the UI shows it under the request), which
any worker process on any machine claims and runs. The request's run waits for them,
updating its progress artifact from the recorded chunks, then delivers whatever is
still missing itself (a share that failed for good), so the report is always complete.
Shares are cut from all of the request's chunks, never from the ones still missing, and
are idempotent (key: request and first chunk): a taken-over request's run finds the very
shares it made, some maybe still running on other workers, instead of making new ones
that would overlap them. Chunks record every answer, so a share taken over after its
worker died resumes where that worker stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments.flow_runs import arun_deployment

from campaign_trigger.services import prefect_runs
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import recorded_chunks

# The recorded chunks (a read of the service's database) are looked at every
# RECORDED_SECONDS: the request notices its last chunk within that; the shares' runs (a
# call to the Prefect server, only needed when a share ended without all of its chunks)
# every WAIT_SECONDS.
RECORDED_SECONDS = 0.2
WAIT_SECONDS = 1.0


def shares(chunks: Sequence[int], per_run: int) -> list[list[int]]:
    """The chunks in runs of ``per_run``, in order."""
    return [list(chunks[start : start + per_run]) for start in range(0, len(chunks), per_run)]


async def _start_shares(plan: DeliveryPlan, per_run: int) -> list[UUID]:
    """Every share with a chunk not yet recorded (created, or found by its key)."""
    runs = []
    for share in shares(range(plan.chunk_count), per_run):
        if plan.recorded.issuperset(share):
            continue
        run = await arun_deployment(
            prefect_runs.CHUNKS_DEPLOYMENT_FULL_NAME,
            parameters={"request_id": plan.request_id, "chunk_nos": share},
            flow_run_name=f"{plan.request_id} chunks {share[0] + 1}-{share[-1] + 1}",
            timeout=0,
            idempotency_key=f"{plan.request_id}:chunks:{share[0]}",
            tags=[f"request:{plan.request_id}"],
        )
        runs.append(run.id)
    return runs


async def _all_ended(run_ids: list[UUID]) -> bool:
    """Whether every share has ended: read a page of runs at a time (Prefect refuses a
    larger one; a gigabyte's request has 513 shares), the latest shares first, as they
    are the likeliest to be running, and the first page with one answers."""
    page = prefect_runs.PAGE_LIMIT
    async with get_client() as client:
        for end in range(len(run_ids), 0, -page):
            ids = run_ids[max(0, end - page) : end]
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids)
            )
            if not all(
                r.state is not None and r.state.is_final() and not _dead(r.state.message)
                for r in runs
            ):
                return False
    return True


def _dead(message: str | None) -> bool:
    """A share marked dead is not over: a worker is about to take it over."""
    return message == prefect_runs.DEAD_RUN_MESSAGE


async def fan_out(plan: DeliveryPlan, *, per_run: int) -> set[int]:
    """Deliver the request's chunks through shares on any worker; returns the chunks
    still missing once every share has ended."""
    run_ids = await _start_shares(plan, per_run)
    progress = await artifacts.Progress.start(chunk_count=plan.chunk_count, done=len(plan.recorded))
    every = round(WAIT_SECONDS / RECORDED_SECONDS)  # looks per look at the runs
    looks = 0
    while True:
        done = await recorded_chunks(plan.request_id)
        if len(done) >= plan.chunk_count:
            break
        if looks % every == 0:  # the progress bar and the runs, every WAIT_SECONDS
            progress.show(len(done))
            if await _all_ended(run_ids):
                break
        looks += 1
        await asyncio.sleep(RECORDED_SECONDS)
    progress.show(len(done))
    await progress.close()
    return set(range(plan.chunk_count)) - done
