"""A request's life after creation, driven by its Prefect flow run: cancel, the
scheduled list, and report availability. The flow run's state is the request's state.

``Request.state`` is a mirror kept for queries; whenever Prefect answers, its state
wins and the mirror is corrected. A request still in the outbox (no flow run yet)
is Scheduled by definition and is cancelled in the database alone, atomically, so
the drainer never creates its run (see ``scheduling``).
"""

from __future__ import annotations

import asyncio
import logging

from prefect import get_client
from prefect.client.schemas.objects import StateType
from sqlalchemy import update
from sqlmodel import col, select

from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignNotFound, RequestNotFound, RequestStateError
from campaign_trigger.services import prefect_runs
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Campaign, Channel, Request, RequestState

logger = logging.getLogger(__name__)

ALREADY_CANCELED = "Request already canceled"
CANT_CANCEL = "Request can't be canceled"
NOT_PROCESSED = "Request not processed yet"
NOT_PUBLISHED = "Batches not published yet"

_MIRROR = {
    StateType.SCHEDULED: RequestState.scheduled,
    StateType.PENDING: RequestState.running,
    StateType.RUNNING: RequestState.running,
    StateType.PAUSED: RequestState.running,
    StateType.COMPLETED: RequestState.processed,
    StateType.CANCELLED: RequestState.canceled,
    StateType.CANCELLING: RequestState.canceled,
    StateType.FAILED: RequestState.failed,
    StateType.CRASHED: RequestState.failed,
}


def _load_request(*, org_id: int, request_id: str) -> Request:
    with session_scope() as session:
        request = session.get(Request, request_id)
        if request is None or request.org_id != org_id:
            raise RequestNotFound(request_id)
        return request


def _set_state(request_id: str, state: RequestState) -> None:
    with session_scope() as session:
        session.execute(update(Request).where(col(Request.id) == request_id).values(state=state))


def _cancel_in_outbox(request_id: str) -> bool:
    """Cancel a request with no flow run yet, atomically against the drainer and the flow."""
    with session_scope() as session:
        result = session.execute(
            update(Request)
            .where(col(Request.id) == request_id)
            .where(col(Request.flow_run_id).is_(None))
            .where(col(Request.state) == RequestState.scheduled)
            .values(state=RequestState.canceled)
        )
        return bool(getattr(result, "rowcount", 0))


async def cancel_request(*, org_id: int, request_id: str) -> Request:
    """Cancel a request whose flow run has not started; returns the request as created."""
    request = await asyncio.to_thread(_load_request, org_id=org_id, request_id=request_id)
    if request.state == RequestState.canceled:
        raise RequestStateError(ALREADY_CANCELED)
    if request.flow_run_id is None:
        if await asyncio.to_thread(_cancel_in_outbox, request_id):
            request.state = RequestState.canceled
            return request
        request = await asyncio.to_thread(_load_request, org_id=org_id, request_id=request_id)
        if request.state == RequestState.canceled:
            raise RequestStateError(ALREADY_CANCELED)
        if request.flow_run_id is None:  # the flow claimed it before its run id was stored
            raise RequestStateError(CANT_CANCEL)
    assert request.flow_run_id is not None
    async with get_client() as client:
        run = await prefect_runs.read_run(client, request.flow_run_id)
        state = run.state
        if state is not None and state.type in (StateType.CANCELLED, StateType.CANCELLING):
            await asyncio.to_thread(_set_state, request_id, RequestState.canceled)
            raise RequestStateError(ALREADY_CANCELED)
        cancelled = await prefect_runs.cancel_if_scheduled(client, request.flow_run_id)
        if not cancelled:
            run = await prefect_runs.read_run(client, request.flow_run_id)
            if run.state is not None and run.state.type == StateType.CANCELLED:
                await asyncio.to_thread(_set_state, request_id, RequestState.canceled)
                raise RequestStateError(ALREADY_CANCELED)
            raise RequestStateError(CANT_CANCEL)
    await asyncio.to_thread(_set_state, request_id, RequestState.canceled)
    request.state = RequestState.canceled
    logger.info("request cancelled before its start")
    return request


def _campaign_requests(*, org_id: int, campaign_id: str) -> list[Request]:
    """The campaign's requests the mirror still calls scheduled (outbox included)."""
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id)
        if campaign is None or campaign.org_id != org_id:
            raise CampaignNotFound(f"Campaign with identifier {campaign_id} was not found")
        return list(
            session.exec(
                select(Request)
                .where(Request.campaign_id == campaign_id)
                .where(Request.org_id == org_id)
                .where(col(Request.state).in_([RequestState.scheduled, RequestState.running]))
                .order_by(col(Request.send_at), col(Request.requested_at))
            ).all()
        )


def _correct_mirror(request_ids: list[str], state: RequestState) -> None:
    if not request_ids:
        return
    with session_scope() as session:
        session.execute(
            update(Request)
            .where(col(Request.id).in_(request_ids))
            .where(col(Request.state) == RequestState.scheduled)
            .values(state=state)
        )


async def scheduled_requests(
    *, org_id: int, campaign_id: str, limit: int, offset: int
) -> tuple[list[Request], int]:
    """The campaign's requests whose flow run is Scheduled (or still in the outbox)."""
    candidates = await asyncio.to_thread(_campaign_requests, org_id=org_id, campaign_id=campaign_id)
    try:
        async with get_client() as client:
            scheduled_ids = await prefect_runs.scheduled_run_ids(
                client, tags=prefect_runs.run_tags(campaign_id=campaign_id, org_id=org_id)
            )
            # The mirror says scheduled, Prefect does not (started, or cancelled in the
            # UI): correct the mirror from the run's state.
            corrections: dict[RequestState, list[str]] = {}
            for r in candidates:
                if (
                    r.state == RequestState.scheduled
                    and r.flow_run_id is not None
                    and r.flow_run_id not in scheduled_ids
                ):
                    run = await prefect_runs.read_run(client, r.flow_run_id)
                    if run.state is not None and run.state.type in _MIRROR:
                        corrections.setdefault(_MIRROR[run.state.type], []).append(r.id)
    except Exception as exc:  # Prefect unreachable: the mirror is the best answer we have
        logger.warning("scheduled list from the database mirror: %r", exc)
        listed = [r for r in candidates if r.state == RequestState.scheduled]
        return listed[offset : offset + limit], len(listed)
    for state, ids in corrections.items():
        await asyncio.to_thread(_correct_mirror, ids, state)
    listed = [
        r
        for r in candidates
        if (r.flow_run_id is None and r.state == RequestState.scheduled)
        or (r.flow_run_id is not None and r.flow_run_id in scheduled_ids)
    ]
    return listed[offset : offset + limit], len(listed)


def _channel(campaign_id: str) -> Channel:
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id)
        return campaign.channel if campaign is not None else Channel.push


async def report_links(*, org_id: int, request_id: str) -> list[str]:
    """Signed links to the request's report files, once its flow run is Completed."""
    request = await asyncio.to_thread(_load_request, org_id=org_id, request_id=request_id)
    channel = await asyncio.to_thread(_channel, request.campaign_id)
    state_type: StateType | None = None
    if request.flow_run_id is not None:
        try:
            async with get_client() as client:
                run = await prefect_runs.read_run(client, request.flow_run_id)
            state_type = run.state.type if run.state else None
        except Exception as exc:
            logger.warning("report: flow run state unavailable, using the mirror: %r", exc)
            state_type = StateType.COMPLETED if request.state == RequestState.processed else None
    if state_type in _MIRROR and _MIRROR[state_type] != request.state and state_type:
        await asyncio.to_thread(_set_state, request_id, _MIRROR[state_type])
    if state_type != StateType.COMPLETED or not request.report_paths:
        if channel == Channel.inapp and state_type in (StateType.RUNNING, StateType.COMPLETED):
            raise RequestStateError(NOT_PUBLISHED)
        raise RequestStateError(NOT_PROCESSED)
    settings = get_settings()
    return [signed_url(settings=settings, path=f"/files/{key}") for key in request.report_paths]
