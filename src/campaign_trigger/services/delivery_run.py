"""The start and end of a request's delivery run: what to send, and the request's state.

:func:`start_delivery` is the run's gate. It refuses a cancelled request, fails a
request whose send time is older than ``settings.max_lateness_seconds`` (a worker
coming back after an outage must not send yesterday's batch: the run fails with
:class:`StaleRequest` and the request is marked failed), and otherwise claims the
request in the database (``scheduled`` -> ``running``) atomically against a
cancel of a request still in the outbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import update
from sqlmodel import col

from campaign_trigger.config import Settings
from campaign_trigger.errors import CampaignTriggerError, RequestNotFound
from campaign_trigger.services import audience
from campaign_trigger.services.delivering import ChunkJob, recorded_chunks
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage
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
    recorded: set[int] = field(default_factory=set)
    canceled: bool = False

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
        )


def _claim(request_id: str) -> bool:
    with session_scope() as session:
        result = session.execute(
            update(Request)
            .where(col(Request.id) == request_id)
            .where(col(Request.state) != RequestState.canceled)
            .values(state=RequestState.running)
        )
        return bool(getattr(result, "rowcount", 0))


def set_state(request_id: str, state: RequestState) -> None:
    with session_scope() as session:
        session.execute(update(Request).where(col(Request.id) == request_id).values(state=state))


def load_request(request_id: str) -> tuple[Request, Campaign]:
    with session_scope() as session:
        request = session.get(Request, request_id)
        if request is None:
            raise RequestNotFound(request_id)
        campaign = session.get(Campaign, request.campaign_id)
        if campaign is None:
            raise RequestNotFound(request_id)
        return request, campaign


def _fixed_chunk_size(settings: Settings, request_id: str) -> int:
    """The chunk size of the request's first run (stored), so re-runs chunk alike."""
    storage = get_storage(settings)
    key = f"work/{request_id}/plan.json"
    if storage.exists(key):
        with storage.open(key, "rb") as handle:
            return int(json.loads(handle.read())["chunk_size"])
    with storage.open(key, "wb") as handle:
        handle.write(json.dumps({"chunk_size": settings.chunk_size}).encode())
    return settings.chunk_size


def start_delivery(
    settings: Settings, request_id: str, *, now: datetime | None = None
) -> DeliveryPlan:
    """Load, gate and claim the request; read its messages; find recorded chunks."""
    request, campaign = load_request(request_id)
    plan = DeliveryPlan(
        request_id=request.id,
        campaign_id=campaign.id,
        channel=campaign.channel,
        title=campaign.title,
        body=campaign.body,
        send_at=request.send_at,
        apps=tuple(audience.campaign_apps(campaign.id)),
        message_count=0,
        chunk_size=settings.chunk_size,
        chunk_count=0,
    )
    if request.state == RequestState.canceled or not _claim(request_id):
        plan.canceled = True
        return plan
    lateness = ((now or datetime.now(UTC)) - request.send_at).total_seconds()
    recorded = recorded_chunks(request_id)
    if lateness > settings.max_lateness_seconds and not recorded:
        set_state(request_id, RequestState.failed)
        raise StaleRequest(
            f"Not sent: the send time passed {int(lateness)} s ago, more than the "
            f"{settings.max_lateness_seconds} s allowed (max_lateness_seconds)"
        )
    messages = audience.load_messages(settings, request)
    plan.chunk_size = _fixed_chunk_size(settings, request_id)
    plan.message_count = messages.num_rows
    plan.chunk_count = audience.chunk_count(messages.num_rows, plan.chunk_size)
    plan.recorded = recorded
    return plan
