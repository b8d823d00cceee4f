"""The start and end of a request's delivery run: what to send, and the request's state.

:func:`start_delivery` is the run's gate. It refuses a cancelled request, fails a
request whose send time is older than ``settings.max_lateness_seconds`` (a worker
coming back after an outage must not send yesterday's batch: the run fails with
:class:`StaleRequest` and the request is marked failed), and otherwise claims the
request in the database (``scheduled`` -> ``running``) atomically against a
cancel of a request still in the outbox; a processed request stays processed (a run of
it after its report sends nothing and redoes the report).

A request is delivered by one flow run: the claim records the run's id where the outbox
has not (its drain created the run, then could not write its id: killed, or the database
locked, and the run claimed the request before another drain, which skips a request
no longer scheduled), and refuses a run of another id (a "Custom run" of the deployment
for a request that has its own: both sent every message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import func, or_, true, update
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import PushOptions
from campaign_trigger.errors import CampaignTriggerError, RequestNotFound
from campaign_trigger.services import audience, outcome_log, request_states
from campaign_trigger.services.campaign_content import push_options
from campaign_trigger.services.delivering import ChunkJob
from campaign_trigger.store.models import Campaign, Channel, Request, RequestState


class StaleRequest(CampaignTriggerError):
    """The request's send time is too far in the past to send it now."""


@dataclass(slots=True)
class DeliveryPlan:
    """A request's delivery, as the flow sees it (no personal data)."""

    request_id: str
    campaign_id: str
    channel: Channel
    title: str
    body: str
    send_at: datetime
    apps: tuple[audience.AppTarget, ...]
    message_count: int
    chunk_size: int
    chunk_count: int
    data: tuple[tuple[str, str], ...] = ()  # the campaign's data templates
    image: str | None = None  # the image URL template
    options: PushOptions = field(default_factory=PushOptions)
    recorded: set[int] = field(default_factory=set)
    canceled: bool = False
    delivered_by: str | None = None  # the request's own run, when this run is not it

    def job(self, chunk_no: int) -> ChunkJob:
        return ChunkJob(
            request_id=self.request_id,
            campaign_id=self.campaign_id,
            channel=self.channel,
            title=self.title,
            body=self.body,
            apps=self.apps,
            chunk_no=chunk_no,
            chunk_size=self.chunk_size,
            send_at=self.send_at,
            data=self.data,
            image=self.image,
            options=self.options,
        )


def _claim(session: Session, request_id: str, run_id: str | None) -> bool:
    """The request is running, unless cancelled (False) or processed: a run of it after its
    report (taken over, or retried) leaves it processed and redoes the report
    (``request_states``). With ``run_id`` (the run claiming it), only if the request is
    that run's or has none recorded yet, which it then records."""
    ours = (
        true()
        if run_id is None
        else or_(col(Request.flow_run_id).is_(None), col(Request.flow_run_id) == run_id)
    )
    values: dict[str, object] = {"state": RequestState.running}
    if run_id is not None:
        values["flow_run_id"] = func.coalesce(col(Request.flow_run_id), run_id)
    result = session.execute(
        update(Request)
        .where(col(Request.id) == request_id, ours)
        .where(col(Request.state).not_in(request_states.SETTLED))
        .values(values)
    )
    if getattr(result, "rowcount", 0):
        return True
    state = session.exec(select(Request.state).where(col(Request.id) == request_id, ours)).first()
    return state == RequestState.processed


def own_run(*, session: Session, request_id: str, owner: str) -> None:
    """Note the worker that claimed the request's run (after Prefect accepted its claim)."""
    session.execute(update(Request).where(col(Request.id) == request_id).values(run_owner=owner))


def canceled(*, session: Session, request_id: str) -> bool:
    """Whether the request is cancelled (one key lookup)."""
    state = session.exec(select(Request.state).where(col(Request.id) == request_id)).first()
    return state == RequestState.canceled


def delivered(*, session: Session, request_id: str) -> bool:
    """Whether the request runs with every chunk recorded: nothing is left to send, its run
    writes the report."""
    request = session.get(Request, request_id)
    if request is None or request.state != RequestState.running:
        return False
    count = audience.chunk_count(request.message_count, request.chunk_size)
    return outcome_log.recorded_chunk_count(session=session, request_id=request_id) >= count


def load_request(*, session: Session, request_id: str) -> tuple[Request, Campaign]:
    request = session.get(Request, request_id)
    if request is None:
        raise RequestNotFound(request_id)
    campaign = session.get(Campaign, request.campaign_id)
    if campaign is None:
        raise RequestNotFound(request_id)
    return request, campaign


def read_plan(*, session: Session, request_id: str) -> DeliveryPlan:
    """The request's delivery as it stands (no gate, no claim; ``canceled`` if the request
    is): for a share of its chunks run elsewhere."""
    request, campaign = load_request(session=session, request_id=request_id)
    plan = delivery_plan(session=session, request=request, campaign=campaign)
    plan.recorded = outcome_log.recorded_chunks(session=session, request_id=request_id)
    plan.canceled = request.state == RequestState.canceled
    return plan


def delivery_plan(*, session: Session, request: Request, campaign: Campaign) -> DeliveryPlan:
    """How ``request`` of ``campaign`` is delivered (stored or not: a preview's too)."""
    return DeliveryPlan(
        request_id=request.id,
        campaign_id=campaign.id,
        channel=campaign.channel,
        title=campaign.title,
        body=campaign.body,
        send_at=request.send_at,
        apps=tuple(audience.campaign_apps(session=session, campaign_id=campaign.id)),
        message_count=request.message_count,
        chunk_size=request.chunk_size,
        chunk_count=audience.chunk_count(request.message_count, request.chunk_size),
        data=tuple(campaign.data.items()),
        image=campaign.image,
        options=push_options(campaign),
    )


def start_delivery(
    *,
    session: Session,
    settings: Settings,
    request_id: str,
    run_id: str | None = None,
    now: datetime | None = None,
) -> DeliveryPlan:
    """Load, gate and claim the request for the flow run ``run_id`` (None: any); find its
    chunks already recorded.

    Commits: the claim (or the failure of a stale request) stands whatever follows.
    """
    plan = read_plan(session=session, request_id=request_id)
    if plan.canceled or not _claim(session, request_id, run_id):
        own = session.exec(select(Request.flow_run_id).where(col(Request.id) == request_id))
        if run_id is not None and (owner := own.first()) not in (None, run_id):
            plan.delivered_by = owner
        plan.canceled = True
        return plan
    lateness = ((now or datetime.now(UTC)) - plan.send_at).total_seconds()
    if lateness > settings.max_lateness_seconds and not plan.recorded:
        request_states.set_state(session=session, request_id=request_id, state=RequestState.failed)
        session.commit()
        raise StaleRequest(
            f"Not sent: the send time passed {int(lateness)} s ago, more than the "
            f"{settings.max_lateness_seconds} s allowed (max_lateness_seconds)"
        )
    session.commit()
    return plan
