"""The delivery flows: ``deliver-request`` (one run per request, its state the request's
state) and ``deliver-chunks`` (a share of a large request's chunks, on any worker)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast
from uuid import UUID

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import FlowRunContext
from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH
from prefect.states import Cancelled
from prefect.utilities.annotations import quote

from campaign_trigger.config import get_settings
from campaign_trigger.flows import fan_out as sharing
from campaign_trigger.flows.fan_out import fan_out
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import (
    assemble_report,
    deliver_chunk,
    mark_failed,
    prepare_delivery,
    read_plan,
    request_goes_on,
)

# No result is ever stored (persist_result=False), but a flow without a result storage
# of its own makes the engine ask the server for its default on every run (a blocking
# GET /admin/storage per request): name Prefect's local default instead.
RESULT_STORAGE = PREFECT_RESULTS_LOCAL_STORAGE_PATH.value()


async def _on_failure(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Mirror the failure on the request, off the event loop: the engine awaits a hook
    on the worker's loop, which every run of the process and its cancel watch share (a
    write waiting for the database's lock blocked them all)."""
    await asyncio.to_thread(mark_failed, str(flow_run.parameters["request_id"]))


def _no_slot(*, last: bool) -> contextlib.AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


async def _deliver_here(
    plan: DeliveryPlan,
    todo: list[int],
    *,
    progress: bool,
    slot: Callable[..., contextlib.AbstractAsyncContextManager[None]] = _no_slot,
    go_on: Callable[[], Awaitable[bool]] | None = None,
) -> bool:
    """One task run per chunk of ``todo``, one after the other, each inside
    ``slot(last=...)``, with a progress artifact if asked; whether every one was started
    (:func:`_deliver_chunks`'s ``go_on``)."""
    shown = None
    if progress:
        shown = artifacts.Progress(chunk_count=plan.chunk_count, done=plan.chunk_count - len(todo))
    chunks = ((chunk_no, n == len(todo)) for n, chunk_no in enumerate(todo, start=1))
    done = await _deliver_chunks(plan, chunks, slot=slot, shown=shown, go_on=go_on)
    if shown is not None:
        await shown.close()
    return done


async def _deliver_chunks(
    plan: DeliveryPlan,
    chunks: Iterator[tuple[int, bool]],
    *,
    slot: Callable[..., contextlib.AbstractAsyncContextManager[None]] = _no_slot,
    shown: artifacts.Progress | None = None,
    go_on: Callable[[], Awaitable[bool]] | None = None,
) -> bool:
    """One task run per chunk of ``chunks`` (each with whether it is the last), one after
    the other (a chunk's database writes already overlap its sends), each inside
    ``slot(last=...)``; each chunk's end shown on ``shown``. Before each chunk after the
    first, ``go_on()`` if given: none more once it says no (False)."""
    # Prefect walks a task's arguments before each run, looking for futures and states
    # to wait for: the plan holds neither, and walking it cost ~0.4 ms a chunk task (a
    # late share of a gigabyte, with 5,000 chunks recorded, ~30 ms). Quoted, it is
    # handed to the task as it is.
    quoted = cast(DeliveryPlan, quote(plan))
    for n, (chunk_no, last) in enumerate(chunks):
        if n and go_on is not None and not await go_on():
            return False
        async with slot(last=last):
            await deliver_chunk(quoted, chunk_no)
        sharing.chunk_ended(plan.request_id)
        if shown is not None:
            shown.show(shown.done + 1)  # the next chunk does not wait for the Prefect API
    return True


def _in_worker() -> tuple[sharing.ShareSlots, UUID] | None:
    """The worker process's chunk slots and the id of the flow run being executed (None
    outside a worker: a run from Python delivers its chunks one after another)."""
    slots, context = sharing.share_slots, FlowRunContext.get()
    if slots is None or context is None or context.flow_run is None:
        return None
    return slots, context.flow_run.id


async def _deliver_own_shares(plan: DeliveryPlan, chunks: Iterator[tuple[int, bool]]) -> None:
    """The request's own shares: in a worker their chunks hold the chunk slots as a share
    run's do, and they hold a place in the chunks queue as a share run does.

    ``fan_out`` starts this before it offers the first share run (whose creation is a
    call to the Prefect server), so the place is taken before the worker could claim it.
    """
    in_worker = _in_worker()
    if in_worker is None:
        await _deliver_chunks(plan, chunks)
        return
    slots, run_id = in_worker
    with slots.own_share(run_id):
        await _deliver_chunks(plan, chunks, slot=functools.partial(slots.chunk, run_id))


@flow(
    name="deliver-request",  # runs are named after the request when created
    persist_result=False,
    result_storage=RESULT_STORAGE,
    on_failure=[_on_failure],
    on_crashed=[_on_failure],
)
async def deliver_request(request_id: str) -> dict[str, int] | State[Any]:
    """Deliver a request: gate, wait for its send time, chunks, report."""
    plan = await prepare_delivery(request_id)
    if plan.delivered_by is not None:  # a second run of the request (a "Custom run")
        return Cancelled(
            message=f"Not sent: the request is delivered by its run {plan.delivered_by}"
        )
    if plan.canceled:
        return Cancelled(message="The request was cancelled before its start")
    # Chunks prepare (audience, rendering, connections) before send_at and wait for it
    # just before their first send: never early, and no preparation after the bell.
    settings = get_settings()
    if plan.chunk_count > settings.chunks_per_run:  # large: every worker takes a share
        # Decided on the chunk count, never on what is left: a taken-over run must wait
        # for the shares it made, which may still be running elsewhere.
        missing = await fan_out(
            plan,
            per_run=settings.chunks_per_run,
            live=settings.live_shares,
            deliver_here=functools.partial(_deliver_own_shares, plan),
        )
        todo = sorted(missing)
    else:
        todo = [n for n in range(plan.chunk_count) if n not in plan.recorded]
    if todo:
        await _deliver_here(plan, todo, progress=plan.chunk_count > 1)
    summary = await assemble_report(plan)
    await artifacts.publish_summary(request_id=request_id, summary=summary)
    return {name or "sent": count for name, count in summary.totals().items()}


@flow(name="deliver-chunks", persist_result=False, result_storage=RESULT_STORAGE)
async def deliver_chunks(request_id: str, chunk_nos: list[int]) -> int | State[Any]:
    """Deliver a share of a request's chunks (the request's run made this its subflow),
    none if the request was cancelled (a share claimed as its request's run stopped), and
    none more once it is (the request is marked canceled as its run is stopped, before its
    shares are set Cancelling: each reaches its worker as an event, seconds later, or at
    its cancel watch's next look)."""
    plan = await read_plan(request_id)
    if plan.canceled:
        return Cancelled(message="The request was cancelled")
    todo = [n for n in chunk_nos if n not in plan.recorded]
    in_worker = _in_worker()
    slot = _no_slot if in_worker is None else functools.partial(in_worker[0].chunk, in_worker[1])
    go_on = functools.partial(request_goes_on, request_id)
    if not await _deliver_here(plan, todo, progress=False, slot=slot, go_on=go_on):
        return Cancelled(message="The request was cancelled")
    return len(todo)
