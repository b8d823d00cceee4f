"""The ``deliver-request`` flow: one run per request, its state the request's state."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import Cancelled

from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import (
    assemble_report,
    deliver_chunk,
    mark_failed,
    prepare_delivery,
)

CHUNKS_IN_FLIGHT = 2  # overlap one chunk's database writes with the next one's sends


def _on_failure(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    mark_failed(str(flow_run.parameters["request_id"]))


async def _deliver_chunks(plan: DeliveryPlan, todo: list[int]) -> None:
    """One task run per chunk, two in flight, with a progress artifact."""
    done = plan.chunk_count - len(todo)
    progress = await artifacts.start_progress(chunk_count=plan.chunk_count, done=done)
    in_flight = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

    async def one_chunk(chunk_no: int) -> None:
        nonlocal done
        async with in_flight:
            await deliver_chunk.with_options(
                task_run_name=f"deliver chunk {chunk_no + 1}/{plan.chunk_count}"
            )(plan, chunk_no)
            done += 1
            await artifacts.update_progress(progress, chunk_count=plan.chunk_count, done=done)

    await asyncio.gather(*(one_chunk(n) for n in todo))


@flow(
    name="deliver-request",  # runs are named after the request when created
    persist_result=False,
    on_failure=[_on_failure],
    on_crashed=[_on_failure],
)
async def deliver_request(request_id: str) -> dict[str, int] | State[Any]:
    """Deliver a request: gate, wait for its send time, chunks, report."""
    plan = await prepare_delivery.fn(request_id)
    if plan.canceled:
        return Cancelled(message="The request was cancelled before its start")
    # Chunks prepare (audience, rendering, connections) before send_at and wait for it
    # just before their first send: never early, and no preparation after the bell.
    todo = [n for n in range(plan.chunk_count) if n not in plan.recorded]
    if plan.chunk_count == 1:
        for chunk_no in todo:
            await deliver_chunk.fn(plan, chunk_no)
    elif todo:
        await _deliver_chunks(plan, todo)
    summary = await assemble_report.fn(plan)
    await artifacts.publish_summary(request_id=request_id, summary=summary)
    return {name or "sent": count for name, count in summary.totals().items()}
