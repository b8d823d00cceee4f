"""What an operator looks at (``campaign-trigger status``, ``requests show ID``): every
part's health, the outbox, the webhook events waiting, the workers online, the scheduled
requests per campaign, the last failed requests, and one request in full. Across
organisations: operators only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prefect import get_client
from sqlmodel import Session, col, func, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import RequestNotFound, RequestStateError
from campaign_trigger.services import health, lifecycle, prefect_runs, scheduling, webhooks
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Outcome, Request, RequestState

FAILURES_SHOWN = 5


@dataclass
class StackStatus:
    health: dict[str, Any]
    outbox_depth: int | None = None
    webhooks_waiting: int | None = None
    workers: list[str] | None = None  # None: Prefect could not be asked
    scheduled: list[tuple[str, int]] = field(default_factory=list)  # (campaign, requests)
    failures: list[Request] = field(default_factory=list)


@dataclass
class RequestDetail:
    request: Request
    outcomes: dict[str, int]  # "sent" or the report's error_message -> messages
    reports: list[str]  # signed links, once processed
    run_url: str | None


def _database_figures(status: StackStatus) -> None:
    with session_scope() as session:
        status.outbox_depth = scheduling.outbox_depth(session=session)
        status.webhooks_waiting = webhooks.waiting_events(session=session)
        status.scheduled = [
            (campaign, int(count))
            for campaign, count in session.exec(
                select(Request.campaign_id, func.count())
                .where(Request.state == RequestState.scheduled)
                .group_by(col(Request.campaign_id))
                .order_by(col(Request.campaign_id))
            ).all()
        ]
        status.failures = list(
            session.exec(
                select(Request)
                .where(Request.state == RequestState.failed)
                .order_by(col(Request.requested_at).desc())
                .limit(FAILURES_SHOWN)
            ).all()
        )


async def stack_status(*, settings: Settings, pool: str) -> StackStatus:
    """Each part's health, then what can be read of the parts that answer."""
    status = StackStatus(health=await health.check(settings))
    if "database" not in status.health["down"]:
        _database_figures(status)
    if "prefect" not in status.health["down"]:
        async with get_client() as client:
            status.workers = await prefect_runs.online_workers(client, pool=pool)
    return status


def outcome_counts(*, session: Session, request_id: str) -> dict[str, int]:
    """Messages per outcome of a request (``sent`` for the ones sent)."""
    rows = session.exec(
        select(Outcome.error_message, func.count())
        .where(Outcome.request_id == request_id)
        .group_by(col(Outcome.error_message))
    ).all()
    counts: Counter[str] = Counter({(error or "sent"): int(count) for error, count in rows})
    return dict(counts.most_common())


async def request_detail(*, session: Session, settings: Settings, request_id: str) -> RequestDetail:
    """One request, whatever its organisation: state, outcomes, report links, run page."""
    request = session.get(Request, request_id)
    if request is None:
        raise RequestNotFound(request_id)
    try:
        reports = await lifecycle.report_links(
            session=session, settings=settings, org_id=request.org_id, request_id=request_id
        )
    except RequestStateError:
        reports = []
    session.refresh(request)  # the state the report call may have corrected
    return RequestDetail(
        request=request,
        outcomes=outcome_counts(session=session, request_id=request_id),
        reports=reports,
        run_url=prefect_runs.run_url(request.flow_run_id) if request.flow_run_id else None,
    )
