"""A request's life after creation, driven by its Prefect flow run: cancel, the
scheduled list, and report availability. The flow run's state is the request's state.

``Request.state`` is a mirror kept for queries; whenever Prefect answers, its state
wins and the mirror is corrected. A request still in the outbox (no flow run yet)
is Scheduled by definition and is cancelled in the database alone, atomically, so
the drainer never creates its run (see ``scheduling``).

Each read ends its transaction before Prefect is asked: no pooled connection (nor, on
PostgreSQL, an open transaction) is held while a call waits for the Prefect server.
"""

from __future__ import annotations

import logging

from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from sqlalchemy import ColumnElement, Subquery, func, tuple_, update
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from campaign_trigger.config import Settings
from campaign_trigger.errors import CampaignNotFound, RequestNotFound, RequestStateError
from campaign_trigger.schemas.text import storable
from campaign_trigger.services import (
    lookup,
    prefect_runs,
    request_states,
    scheduling,
    webhooks,
)
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import in_thread
from campaign_trigger.store.models import Campaign, Channel, Request, RequestState

logger = logging.getLogger(__name__)

ALREADY_CANCELED = "Request already canceled"
CANT_CANCEL = "Request can't be canceled"
NOT_PROCESSED = "Request not processed yet"
NOT_PUBLISHED = "Batches not published yet"
OPEN = (RequestState.scheduled, RequestState.running)


def _load_request(session: Session, *, org_id: int, request_id: str) -> Request:
    request = lookup.org_request(session=session, org_id=org_id, request_id=request_id)
    session.commit()
    if request is None:
        raise RequestNotFound(request_id)
    return request


def _reloaded(session: Session, request: Request) -> Request:
    session.refresh(request)
    session.commit()
    return request


def _mark_canceled(session: Session, request_id: str) -> RequestState:
    """Mark the request canceled unless it is settled; its state after."""
    request_states.set_state(session=session, request_id=request_id, state=RequestState.canceled)
    state = RequestState(session.exec(select(Request.state).where(Request.id == request_id)).one())
    session.commit()
    return state


async def _already_canceled(session: Session, request_id: str) -> RequestStateError:
    """Its run was cancelled: the request is canceled, unless its report marked it
    processed first (a cancel that came too late, whose run its worker completes)."""
    if await in_thread(_mark_canceled, session, request_id) == RequestState.processed:
        return RequestStateError(CANT_CANCEL)
    return RequestStateError(ALREADY_CANCELED)


def _cancel_in_outbox(session: Session, request_id: str) -> bool:
    """Cancel a request with no flow run yet, atomically against the drainer and the flow."""
    result = session.execute(
        update(Request)
        .where(col(Request.id) == request_id, *scheduling.in_outbox())
        .values(state=RequestState.canceled)
    )
    cancelled = bool(getattr(result, "rowcount", 0))
    if cancelled:
        webhooks.record_final_state(
            session=session, request_id=request_id, state=RequestState.canceled
        )
    session.commit()
    return cancelled


def _cancel_runless(session: Session, request_id: str) -> RequestState | None:
    """Cancel a request whose flow run is gone if the mirror still calls it scheduled
    (one update, so no other write of the mirror is overwritten): None if it did, else
    the state that refused it."""
    if request_states.set_state(
        session=session,
        request_id=request_id,
        state=RequestState.canceled,
        only_from=[RequestState.scheduled],
    ):
        session.commit()
        return None
    state = RequestState(session.exec(select(Request.state).where(Request.id == request_id)).one())
    session.commit()
    return state


async def _cancel_without_run(session: Session, request: Request) -> Request:
    """The cancel of a request whose flow run Prefect no longer knows (deleted in its UI).

    As the report does, the database mirror answers: nothing creates a deleted run again
    and no worker can claim it, so a request the mirror calls scheduled would never be
    sent, and cancelling it is what the caller asked for (its ``request.cancelled``
    event is queued as any cancel's). One the mirror says started (running, failed) or
    processed is refused as started; one cancelled meanwhile is already canceled."""
    logger.warning("cancel: the flow run of request %s is gone, the mirror decides", request.id)
    refused_by = await in_thread(_cancel_runless, session, request.id)
    if refused_by == RequestState.canceled:
        raise RequestStateError(ALREADY_CANCELED)
    if refused_by is not None:
        raise RequestStateError(CANT_CANCEL)
    request.state = RequestState.canceled
    return request


async def cancel_request(*, session: Session, org_id: int, request_id: str) -> Request:
    """Cancel a request whose flow run has not started; returns the request as created.

    A request whose run was deleted in the Prefect UI is cancelled if the mirror calls it
    scheduled (:func:`_cancel_without_run`)."""
    request = await in_thread(_load_request, session, org_id=org_id, request_id=request_id)
    if request.state == RequestState.canceled:
        raise RequestStateError(ALREADY_CANCELED)
    if request.state == RequestState.processed:  # never left (request_states.SETTLED)
        raise RequestStateError(CANT_CANCEL)
    if request.flow_run_id is None:
        if await in_thread(_cancel_in_outbox, session, request_id):
            request.state = RequestState.canceled
            return request
        request = await in_thread(_reloaded, session, request)
        if request.state == RequestState.canceled:
            raise RequestStateError(ALREADY_CANCELED)
        if request.flow_run_id is None:  # the flow claimed it before its run id was stored
            raise RequestStateError(CANT_CANCEL)
    assert request.flow_run_id is not None
    try:
        async with prefect_runs.client() as client:
            run = await prefect_runs.read_run(client, request.flow_run_id)
            state = run.state
            if state is not None and state.type in (StateType.CANCELLED, StateType.CANCELLING):
                raise await _already_canceled(session, request_id)
            cancelled = await prefect_runs.cancel_if_scheduled(client, request.flow_run_id, run=run)
            if not cancelled:
                run = await prefect_runs.read_run(client, request.flow_run_id)
                if run.state is not None and run.state.type == StateType.CANCELLED:
                    raise await _already_canceled(session, request_id)
                raise RequestStateError(CANT_CANCEL)
    except ObjectNotFound:  # its read, its claim or its cancel: deleted at any point
        return await _cancel_without_run(session, request)
    await in_thread(_mark_canceled, session, request_id)
    request.state = RequestState.canceled
    logger.info("request cancelled before its start")
    return request


def _open_requests(*, org_id: int, campaign_id: str) -> SelectOfScalar[Request]:
    """The campaign's requests the mirror still calls scheduled or running, soonest first
    (the id breaks ties, so that a page can resume after any row)."""
    return (
        select(Request)
        .where(Request.campaign_id == campaign_id)
        .where(Request.org_id == org_id)
        .where(col(Request.state).in_(OPEN))
        .order_by(col(Request.send_at), col(Request.requested_at), col(Request.id))
    )


def _resume(after: Request) -> ColumnElement[bool]:
    """The requests after ``after`` in the list's order."""
    return tuple_(col(Request.send_at), col(Request.requested_at), col(Request.id)) > tuple_(
        after.send_at, after.requested_at, after.id
    )


def _cursor(
    session: Session, *, org_id: int, campaign_id: str, after: str | None
) -> Request | None:
    """The request a page starts after (None: the first page). One of the campaign's,
    in any state: one that started or was cancelled since it ended the last page still
    marks the place."""
    if after is None:
        return None
    request = None
    if storable(after):
        request = session.exec(
            select(Request).where(
                Request.id == after, Request.org_id == org_id, Request.campaign_id == campaign_id
            )
        ).first()
    if request is None:
        raise RequestNotFound(after)
    return request


def _first_candidates(
    session: Session, *, org_id: int, campaign_id: str, count: int, after: str | None
) -> tuple[list[Request], Request | None, int]:
    """The first ``count`` open requests of the campaign (after the request ``after``),
    that request, and how many open requests the mirror calls scheduled in all, on every
    page (counted by the same statement on the first page)."""
    if lookup.org_campaign(session=session, org_id=org_id, campaign_id=campaign_id) is None:
        raise CampaignNotFound(f"Campaign with identifier {campaign_id} was not found")
    start = _cursor(session, org_id=org_id, campaign_id=campaign_id, after=after)
    if start is None:
        scheduled = func.count().filter(col(Request.state) == RequestState.scheduled).over()
        rows = session.execute(
            _open_requests(org_id=org_id, campaign_id=campaign_id)
            .add_columns(scheduled)
            .limit(count)
        ).all()
        session.commit()
        return [request for request, _ in rows], None, rows[0][1] if rows else 0
    requests = _more_candidates(
        session, org_id=org_id, campaign_id=campaign_id, after=start, count=count
    )
    total = session.exec(select(func.count()).select_from(_mirrored(org_id, campaign_id)))
    count_all = total.one()
    session.commit()
    return requests, start, count_all


def _more_candidates(
    session: Session, *, org_id: int, campaign_id: str, after: Request, count: int
) -> list[Request]:
    """The next ``count`` open requests of the campaign after ``after``."""
    requests = list(
        session.exec(
            _open_requests(org_id=org_id, campaign_id=campaign_id)
            .where(_resume(after))
            .limit(count)
        ).all()
    )
    session.commit()
    return requests


def _mirrored(org_id: int, campaign_id: str) -> Subquery:
    """The campaign's requests the mirror calls scheduled."""
    return (
        _open_requests(org_id=org_id, campaign_id=campaign_id)
        .where(col(Request.state) == RequestState.scheduled)
        .order_by(None)
        .subquery()
    )


def _mirrored_page(
    session: Session,
    *,
    org_id: int,
    campaign_id: str,
    limit: int,
    offset: int,
    after: Request | None,
) -> tuple[list[Request], int]:
    """The page as the mirror has it, and its total (when Prefect cannot be asked)."""
    mirrored = _open_requests(org_id=org_id, campaign_id=campaign_id).where(
        col(Request.state) == RequestState.scheduled
    )
    if after is not None:
        mirrored = mirrored.where(_resume(after))
    page = list(session.exec(mirrored.limit(limit).offset(offset)).all())
    total = session.exec(select(func.count()).select_from(_mirrored(org_id, campaign_id)))
    session.commit()
    return page, total.one()


Corrections = dict[str, tuple[RequestState, RequestState]]  # request -> (seen, wanted)


def _correct(session: Session, corrections: Corrections) -> None:
    """Write each wanted state, only over the state that was seen (never a newer one)."""
    for request_id, (seen, wanted) in corrections.items():
        request_states.set_state(
            session=session, request_id=request_id, state=wanted, only_from=[seen]
        )
    session.commit()


async def scheduled_requests(
    *,
    session: Session,
    org_id: int,
    campaign_id: str,
    limit: int,
    offset: int,
    after: str | None = None,
) -> tuple[list[Request], int]:
    """The campaign's requests whose flow run is Scheduled (or still in the outbox),
    from the ``offset``-th one after the request ``after`` (from the first without it):
    pages that go on from the last request of the page before do not shift when a
    request of an earlier page starts or is cancelled meanwhile, as offsets do.

    Prefect is asked about the requests up to the page's end only, a window of as many
    runs as the page still lacks at a time (:data:`prefect_runs.PAGE_LIMIT` at most), and
    the database is read up to the page's end too (more only when Prefect left some
    out), so a list costs what its page costs, not the campaign's whole backlog: the
    mirror says which requests are scheduled, and a request the mirror calls scheduled
    but whose run is not (started, or cancelled in the UI) is corrected and left out.
    The total counts the requests checked, plus those beyond the page the mirror calls
    scheduled (corrected in turn when a page reaches them)."""
    wanted = offset + limit
    candidates, start, scheduled_total = await in_thread(
        _first_candidates,
        session,
        org_id=org_id,
        campaign_id=campaign_id,
        count=wanted,
        after=after,
    )
    exhausted = len(candidates) < wanted
    listed: list[Request] = []
    corrections: Corrections = {}
    checked = 0
    try:
        async with prefect_runs.client() as client:
            while len(listed) < wanted:
                lacking = min(wanted - len(listed), prefect_runs.PAGE_LIMIT)
                short = checked + lacking - len(candidates)
                if short > 0 and not exhausted:
                    more = await in_thread(
                        _more_candidates,
                        session,
                        org_id=org_id,
                        campaign_id=campaign_id,
                        after=candidates[-1],
                        count=short,
                    )
                    exhausted = len(more) < short
                    candidates += more
                window = candidates[checked : checked + lacking]
                if not window:
                    break
                checked += len(window)
                scheduled_ids = await prefect_runs.scheduled_among(
                    client, [r.flow_run_id for r in window if r.flow_run_id is not None]
                )
                for r in window:
                    if r.flow_run_id is None or r.flow_run_id in scheduled_ids:
                        if r.flow_run_id is not None or r.state == RequestState.scheduled:
                            listed.append(r)
                    elif r.state == RequestState.scheduled:
                        # The mirror says scheduled, Prefect does not: correct the mirror.
                        try:
                            run = await prefect_runs.read_run(client, r.flow_run_id)
                        except ObjectNotFound:  # deleted in the UI: the mirror answers, as
                            listed.append(r)  # the cancel's does (nothing will send it)
                            continue
                        wanted_state = request_states.mirror_of(
                            run.state, has_reports=bool(r.report_paths)
                        )
                        if wanted_state is not None and wanted_state != r.state:
                            corrections[r.id] = (r.state, wanted_state)
    except Exception as exc:  # Prefect unreachable: the mirror is the best answer we have
        logger.warning("scheduled list from the database mirror: %r", exc)
        return await in_thread(
            _mirrored_page,
            session,
            org_id=org_id,
            campaign_id=campaign_id,
            limit=limit,
            offset=offset,
            after=start,
        )
    # before the corrections, which update these very objects
    seen = sum(1 for r in candidates[:checked] if r.state == RequestState.scheduled)
    if corrections:
        await in_thread(_correct, session, corrections)
    return listed[offset:wanted], len(listed) + max(0, scheduled_total - seen)


def _request_and_channel(
    session: Session, *, org_id: int, request_id: str
) -> tuple[Request, Channel]:
    request = _load_request(session, org_id=org_id, request_id=request_id)
    campaign = session.get(Campaign, request.campaign_id)
    session.commit()
    return request, campaign.channel if campaign is not None else Channel.push


async def report_links(
    *, session: Session, settings: Settings, org_id: int, request_id: str
) -> list[str]:
    """Signed links to the request's report files, once its flow run is Completed."""
    request, channel = await in_thread(
        _request_and_channel, session, org_id=org_id, request_id=request_id
    )
    state_type: StateType | None = None
    wanted: RequestState | None = None  # the mirror's correction, if Prefect answers
    if request.flow_run_id is not None:
        try:
            async with prefect_runs.client() as client:
                run = await prefect_runs.read_run(client, request.flow_run_id)
            state_type = run.state.type if run.state else None
            wanted = request_states.mirror_of(run.state, has_reports=bool(request.report_paths))
        except Exception as exc:
            logger.warning("report: flow run state unavailable, using the mirror: %r", exc)
            state_type = StateType.COMPLETED if request.state == RequestState.processed else None
    if wanted is not None and wanted != request.state:
        await in_thread(_correct, session, {request_id: (request.state, wanted)})
    if state_type != StateType.COMPLETED or not request.report_paths:
        if channel == Channel.inapp and state_type in (StateType.RUNNING, StateType.COMPLETED):
            raise RequestStateError(NOT_PUBLISHED)
        raise RequestStateError(NOT_PROCESSED)
    return [signed_url(settings=settings, path=f"/files/{key}") for key in request.report_paths]
