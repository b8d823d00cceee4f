"""The delivery steps of a request: prepare, deliver a chunk, assemble the report.

Each step is a task run of the request's flow run (the Prefect UI shows ``prepare
delivery``, ``deliver chunk 3/40``, ``assemble report``, with their logs and timings)
and a thin wrapper over a service (``services/delivery_run``, ``services/delivering``,
``services/reports``): the business rules live there. The tasks are the edge that
opens the database session a service works in. Blocking database and file work runs
in a thread, so one worker process can run several requests' flows on one event
loop. Logs carry counts, never personal data.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prefect import Task, get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.tasks import TaskRunNameCallbackWithParameters

from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignTriggerError
from campaign_trigger.services import (
    delivering,
    delivery_run,
    message_file,
    outcome_log,
    reports,
    request_states,
)
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage, messages_key
from campaign_trigger.store.models import RequestState


async def _worth_retrying(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry a step that failed on the way (a database or storage hiccup), never one the
    service refused on purpose (a stale or unknown request), nor a chunk whose sends
    broke off part way (:class:`delivering.SendsInterrupted`: its messages in flight
    would go twice): a step that failed before its first send is safe to retry, since a
    chunk resumes at its first unrecorded message.

    A coroutine: Prefect's engine calls the condition of an async task inside its event
    loop, where ``state.result()`` gives back a coroutine instead of raising, so a plain
    function found no error and no step was ever retried."""
    try:
        await state.aresult(raise_on_failure=True)
    except (CampaignTriggerError, delivering.SendsInterrupted):
        return False
    except Exception:
        return True
    return False


RETRIES: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [2, 10],
    "retry_condition_fn": _worth_retrying,
}


@task(
    name="prepare delivery",
    task_run_name="prepare delivery",
    cache_policy=NO_CACHE,
    persist_result=False,
    **RETRIES,
)
async def prepare_delivery(request_id: str) -> DeliveryPlan:
    """Gate and claim the request for this flow run, find the chunks already recorded."""
    run_id = runtime.flow_run.get_id()

    def prepare() -> DeliveryPlan:
        with session_scope() as session:
            return delivery_run.start_delivery(
                session=session, settings=get_settings(), request_id=request_id, run_id=run_id
            )

    plan = await asyncio.to_thread(prepare)
    if plan.delivered_by is not None:
        why = f" - delivered by its own run {plan.delivered_by}, nothing to send"
    else:
        why = " - request cancelled, nothing to send" if plan.canceled else ""
    get_run_logger().info(
        "%d messages, %d apps, %d chunks of %d (%d already recorded)%s",
        plan.message_count,
        len(plan.apps),
        plan.chunk_count,
        plan.chunk_size,
        len(plan.recorded),
        why,
    )
    return plan


async def read_plan(request_id: str) -> DeliveryPlan:
    """The request's delivery, for a share of its chunks run apart from its own run (a
    read, no task run: a task run is three more events for the Prefect server in every
    share run, docs/benchmarks.md; a share whose read fails fails, and the request's run
    delivers its chunks at the end)."""

    def read() -> DeliveryPlan:
        with session_scope() as session:
            return delivery_run.read_plan(session=session, request_id=request_id)

    return await asyncio.to_thread(read)


async def request_goes_on(request_id: str) -> bool:
    """Whether the request is not cancelled (a read, no task run)."""

    def read() -> bool:
        with session_scope() as session:
            return not delivery_run.canceled(session=session, request_id=request_id)

    return await asyncio.to_thread(read)


async def recorded_chunks(request_id: str) -> set[int]:
    """The request's complete chunks (a read, no task run)."""

    def read() -> set[int]:
        with session_scope() as session:
            return outcome_log.recorded_chunks(session=session, request_id=request_id)

    return await asyncio.to_thread(read)


async def recorded_chunk_count(request_id: str) -> int:
    """How many of the request's chunks are complete (a read, no task run)."""

    def read() -> int:
        with session_scope() as session:
            return outcome_log.recorded_chunk_count(session=session, request_id=request_id)

    return await asyncio.to_thread(read)


def _chunk_run_name(parameters: dict[str, Any]) -> str:
    """``deliver chunk 3/40``: the chunk's place in its request (a task made once, not a
    copy per chunk by ``with_options``, which hashes the function's source each time)."""
    plan: DeliveryPlan = parameters["plan"]
    return f"deliver chunk {parameters['chunk_no'] + 1}/{plan.chunk_count}"


@task(
    name="deliver chunk",
    # Prefect's type for it also asks for its own classmethod: a plain function is cast.
    task_run_name=cast(TaskRunNameCallbackWithParameters, _chunk_run_name),
    cache_policy=NO_CACHE,
    persist_result=False,
    **RETRIES,
)
async def deliver_chunk(plan: DeliveryPlan, chunk_no: int) -> delivering.ChunkResult:
    """Render, send and record one chunk, exactly once."""
    result = await run_chunk(plan, chunk_no)
    logger = get_run_logger()
    if result.skipped:
        logger.info("chunk %d/%d already recorded: skipped", chunk_no + 1, plan.chunk_count)
    else:
        logger.info(
            "chunk %d/%d: %s%s",
            chunk_no + 1,
            plan.chunk_count,
            ", ".join(f"{k or 'sent'}={v}" for k, v in sorted(result.outcomes.items())),
            f" ({result.resumed} recorded by an interrupted run)" if result.resumed else "",
        )
    return result


async def run_chunk(plan: DeliveryPlan, chunk_no: int) -> delivering.ChunkResult:
    """The ``deliver chunk`` task's work, outside any run: read the chunk from the message
    file, then render, send and record it in one session (the benchmarks time it bare)."""
    settings = get_settings()
    chunk = await asyncio.to_thread(
        message_file.read_chunk,
        storage=get_storage(settings),
        key=messages_key(plan.request_id),
        chunk_no=chunk_no,
    )
    with session_scope() as session:
        return await delivering.process_chunk(
            session=session, settings=settings, job=plan.job(chunk_no), chunk=chunk
        )


@task(
    name="assemble report",
    task_run_name="assemble report",
    cache_policy=NO_CACHE,
    persist_result=False,
    **RETRIES,
)
async def assemble_report(plan: DeliveryPlan) -> reports.ReportSummary:
    """Write one CSV per app and mark the request processed."""

    def assemble() -> reports.ReportSummary:
        with session_scope() as session:
            summary = reports.write_reports(
                session=session,
                settings=get_settings(),
                request_id=plan.request_id,
                campaign_id=plan.campaign_id,
                app_ids=[app.app_id for app in plan.apps],
            )
            reports.mark_processed(
                session=session, request_id=plan.request_id, report_paths=summary.report_paths
            )
            return summary

    summary = await asyncio.to_thread(assemble)
    get_run_logger().info(
        "report: %d files, %d rows", len(summary.report_paths), sum(summary.totals().values())
    )
    return summary


def mark_failed(request_id: str) -> None:
    """The run failed or crashed: mirror it on the request."""
    with session_scope() as session:
        request_states.set_state(session=session, request_id=request_id, state=RequestState.failed)
