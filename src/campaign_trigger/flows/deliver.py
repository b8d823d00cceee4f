"""The ``deliver-request`` flow: one run per request, its state the request's state."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import Cancelled

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


@flow(
    name="deliver-request",
    flow_run_name="{request_id}",
    persist_result=False,
    on_failure=[_on_failure],
    on_crashed=[_on_failure],
)
async def deliver_request(request_id: str) -> dict[str, int] | State[Any]:
    """Deliver a request: gate, wait for its send time, chunks, report."""
    plan = await prepare_delivery(request_id)
    if plan.canceled:
        return Cancelled(message="The request was cancelled before its start")
    delay = (plan.send_at - datetime.now(UTC)).total_seconds()
    if delay > 0:  # never deliver before send_at, even when started a little early
        await asyncio.sleep(delay)
    todo = [n for n in range(plan.chunk_count) if n not in plan.recorded]
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
    summary = await assemble_report(plan)
    await artifacts.publish_summary(request_id=request_id, summary=summary)
    return {name or "sent": count for name, count in summary.totals().items()}
