"""The delivery steps of a request: prepare, deliver a chunk, assemble the report.

Each step is a thin wrapper over a service (``services/delivery_run``,
``services/delivering``, ``services/reports``): the business rules live there.
A task run costs ~0.2 s of client CPU, so only chunk deliveries of multi-chunk
requests are task runs (``deliver chunk 3/40``); preparing, a single chunk and the
report run inside the flow run (``.fn``), which keeps a one-message request close
to the cost of an empty flow run (DESIGN §6).
Blocking database and file work runs in a thread, so one worker process can run
several requests' flows on one event loop. Logs carry counts, never personal data.
"""

from __future__ import annotations

import asyncio

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from campaign_trigger.config import get_settings
from campaign_trigger.services import audience, delivering, delivery_run, reports
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.store.models import RequestState


@task(name="prepare delivery", cache_policy=NO_CACHE, persist_result=False)
async def prepare_delivery(request_id: str) -> DeliveryPlan:
    """Gate and claim the request, read its messages, find the chunks already recorded."""
    plan = await asyncio.to_thread(delivery_run.start_delivery, get_settings(), request_id)
    get_run_logger().info(
        "%d messages, %d apps, %d chunks of %d (%d already recorded)%s",
        plan.message_count,
        len(plan.apps),
        plan.chunk_count,
        plan.chunk_size,
        len(plan.recorded),
        " - request cancelled, nothing to send" if plan.canceled else "",
    )
    return plan


@task(name="deliver chunk", cache_policy=NO_CACHE, persist_result=False)
async def deliver_chunk(plan: DeliveryPlan, chunk_no: int) -> delivering.ChunkResult:
    """Render, send and record one chunk, exactly once."""
    settings = get_settings()
    request, _ = await asyncio.to_thread(delivery_run.load_request, plan.request_id)
    messages = await asyncio.to_thread(audience.load_messages, settings, request)
    result = await delivering.deliver_chunk(settings, plan.job(chunk_no), messages)
    logger = get_run_logger()
    if result.skipped:
        logger.info("chunk %d/%d already recorded: skipped", chunk_no + 1, plan.chunk_count)
    else:
        logger.info(
            "chunk %d/%d: %s",
            chunk_no + 1,
            plan.chunk_count,
            ", ".join(f"{k or 'sent'}={v}" for k, v in sorted(result.outcomes.items())),
        )
    return result


@task(name="assemble report", cache_policy=NO_CACHE, persist_result=False)
async def assemble_report(plan: DeliveryPlan) -> reports.ReportSummary:
    """Write one CSV per app and mark the request processed."""
    summary = await asyncio.to_thread(
        reports.write_reports,
        get_settings(),
        request_id=plan.request_id,
        campaign_id=plan.campaign_id,
        app_ids=[app.app_id for app in plan.apps],
    )
    await asyncio.to_thread(
        reports.mark_processed, request_id=plan.request_id, report_paths=summary.report_paths
    )
    audience.forget_messages(plan.request_id)
    get_run_logger().info(
        "report: %d files, %d rows", len(summary.report_paths), sum(summary.totals().values())
    )
    return summary


def mark_failed(request_id: str) -> None:
    """The run failed or crashed: mirror it on the request."""
    delivery_run.set_state(request_id, RequestState.failed)
