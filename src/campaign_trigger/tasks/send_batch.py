"""The steps of the ``send-batch`` flow: create the request, schedule it, wait for it;
or, for a dry run, preview it.

Creating goes through the API's own use case (``services.requests.create_request``):
the same checks in the same order, the same texts, the same request. The flow acts
for the campaign's organisation and takes one unit of its quota, as an API call does
(``services.quota``). It first makes sure the Prefect server it talks to carries the
``deliver-request`` deployment: a call that cannot be delivered stores nothing. A run
of a call that already stored its request (a retry) finds it before either: it is
neither refused nor charged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime

from prefect import get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.utilities.asyncutils import run_coro_as_sync
from sqlmodel import Session

from campaign_trigger.config import get_settings
from campaign_trigger.errors import RequestStateError, ServiceUnavailable
from campaign_trigger.schemas.api import Message
from campaign_trigger.schemas.preview import TriggerPreview
from campaign_trigger.services import lifecycle, prefect_runs, quota, requests, scheduling
from campaign_trigger.services.preview import scratch_storage
from campaign_trigger.services.trigger_input import MISSING, TriggerInput, body_hash
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage
from campaign_trigger.store.models import Request, new_id

WAIT_POLL_SECONDS = 1.0
NO_DELIVERY = (
    "The Prefect server at {url} has no deliver-request deployment, so nothing could "
    "deliver this batch; nothing was stored. Run where the stack's PREFECT_API_URL "
    "applies (make up: PREFECT_API_URL=http://127.0.0.1:4200/api)."
)


@dataclass(frozen=True)
class Accepted:
    """The request a batch became."""

    request_id: str
    org_id: int
    campaign_id: str
    message_count: int


async def _check_delivery_is_deployed() -> None:
    async with get_client() as client:
        try:
            await prefect_runs.deployment_id(client)
        except ObjectNotFound:
            prefect_runs.forget_deployment_id()
            raise ServiceUnavailable(NO_DELIVERY.format(url=PREFECT_API_URL.value())) from None


def _trigger(
    *,
    campaign_id: str,
    send_at: datetime | None,
    messages: list[Message] | None,
    csv_key: str | None,
    idempotency: tuple[str, str] | None = None,
) -> TriggerInput:
    return TriggerInput(
        campaign_id=campaign_id,
        send_at=send_at.isoformat() if send_at is not None else None,
        messages=[m.model_dump() for m in messages] if messages is not None else MISSING,
        source_key=csv_key,
        idempotency_key=idempotency[0] if idempotency else None,
        body_hash=idempotency[1] if idempotency else None,
    )


def _owner_after_quota(session: Session, campaign_id: str) -> int:
    """The campaign's organisation, once one unit of its quota is taken (committed)."""
    org_id = requests.campaign_owner(session=session, campaign_id=campaign_id)
    quota.consume(session=session, org_id=org_id)
    session.commit()  # a refused batch counts, as a refused API call does
    return org_id


def _create(
    *,
    campaign_id: str,
    send_at: datetime | None,
    messages: list[Message] | None,
    csv_key: str | None,
    idempotency: tuple[str, str] | None,
) -> Accepted:
    settings = get_settings()
    request_id = new_id()
    trigger = _trigger(
        campaign_id=campaign_id,
        send_at=send_at,
        messages=messages,
        csv_key=csv_key,
        idempotency=idempotency,
    )
    with session_scope() as session:
        org_id = _owner_after_quota(session, campaign_id)
        created = requests.create_request(
            session=session,
            settings=settings,
            storage=get_storage(settings),
            org_id=org_id,
            request_id=request_id,
            trigger=trigger,
        )
        request = session.get(Request, created)
        count = request.message_count if request is not None else 0
    return Accepted(request_id=created, org_id=org_id, campaign_id=campaign_id, message_count=count)


def _earlier(campaign_id: str, idempotency: tuple[str, str]) -> Accepted | None:
    """The request an earlier run of this call made, found before the deployment check
    and the quota: a retry of a stored batch is neither refused nor charged (a refusal
    would say nothing was scheduled, and the batch would be sent again)."""
    key, digest = idempotency
    with session_scope() as session:
        org_id = requests.campaign_owner(session=session, campaign_id=campaign_id)
        request_id = requests.replayed(session=session, org_id=org_id, key=key, digest=digest)
        request = session.get(Request, request_id) if request_id is not None else None
        if request is None:
            return None
        return Accepted(
            request_id=request.id,
            org_id=org_id,
            campaign_id=campaign_id,
            message_count=request.message_count,
        )


def _idempotency_key() -> str | None:
    """What names this call of send-batch across its runs: a retried or re-run flow run
    finds its request instead of making a second one.

    A subflow's own run is no such name: when its parent flow is retried, Prefect makes
    the subflow a new flow run if it completed without a stored result (ours stores
    none). The parent's task run that stands for the call stays the same one (the
    server keeps one per parent run, task and call order: its ``dynamic_key``), so a
    subflow is named by it.
    """
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None:
        return None
    if flow_run.parent_task_run_id is not None:
        return f"send-batch:call:{flow_run.parent_task_run_id}"
    return f"send-batch:{flow_run.id}"


@task(name="create request", cache_policy=NO_CACHE, persist_result=False)
def create_request(
    *,
    campaign_id: str,
    send_at: datetime | None,
    messages: list[Message] | None,
    csv_key: str | None,
    fingerprint: object,
) -> Accepted:
    """Check and store the batch as a request of the campaign's organisation."""
    key = _idempotency_key()
    idempotency = (key, body_hash(fingerprint)) if key else None
    if idempotency is not None and (earlier := _earlier(campaign_id, idempotency)) is not None:
        return earlier
    run_coro_as_sync(_check_delivery_is_deployed())
    return _create(
        campaign_id=campaign_id,
        send_at=send_at,
        messages=messages,
        csv_key=csv_key,
        idempotency=idempotency,
    )


@task(name="preview request", cache_policy=NO_CACHE, persist_result=False)
def preview_request(
    *,
    campaign_id: str,
    send_at: datetime | None,
    messages: list[Message] | None,
    csv_key: str | None,
) -> TriggerPreview:
    """Check the batch as a create would and describe what it would send; store nothing."""
    settings = get_settings()
    trigger = _trigger(campaign_id=campaign_id, send_at=send_at, messages=messages, csv_key=csv_key)
    with session_scope() as session, scratch_storage(settings) as scratch:
        org_id = _owner_after_quota(session, campaign_id)
        return requests.preview_request(
            session=session,
            settings=settings,
            storage=get_storage(settings),
            scratch=scratch,
            org_id=org_id,
            trigger=trigger,
        )


async def _drain_outbox() -> None:
    with session_scope() as session:
        await scheduling.drain_outbox(session=session)


@task(name="schedule delivery", cache_policy=NO_CACHE, persist_result=False)
def schedule_delivery() -> None:
    """Create the deliver-request run now (the reconcilers would do it within seconds)."""
    try:
        run_coro_as_sync(_drain_outbox())
    except Exception as exc:  # Prefect busy: the request stays in the outbox, not lost
        get_run_logger().warning("delivery run left to the reconciler: %r", exc)


async def _final_state(request_id: str) -> StateType | None:
    """The delivery run's final state type, or None while it has not ended."""
    with session_scope() as session:
        request = session.get(Request, request_id)
        flow_run_id = request.flow_run_id if request is not None else None
    if flow_run_id is None:
        return None
    async with get_client() as client:
        run = await prefect_runs.read_run(client, flow_run_id)
    state = run.state
    return state.type if state is not None and state.is_final() else None


async def _report_when_done(accepted: Accepted, *, timeout_seconds: float) -> list[str]:
    deadline = time.monotonic() + timeout_seconds
    while (final := await _final_state(accepted.request_id)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"The request {accepted.request_id} is stored and scheduled, but its "
                f"delivery did not end within {timeout_seconds:.0f} s; ask for its report "
                "later (GET /api/campaigns/report)"
            )
        await asyncio.sleep(WAIT_POLL_SECONDS)
    if final != StateType.COMPLETED:
        raise RequestStateError(f"The request {accepted.request_id} ended {final.value.lower()}")
    with session_scope() as session:
        return await lifecycle.report_links(
            session=session,
            settings=get_settings(),
            org_id=accepted.org_id,
            request_id=accepted.request_id,
        )


@task(name="wait for the report", cache_policy=NO_CACHE, persist_result=False)
def wait_for_report(accepted: Accepted, *, timeout_seconds: float) -> list[str]:
    """Until the delivery run ends (at most ``timeout_seconds``): the report links."""
    links: list[str] = run_coro_as_sync(
        _report_when_done(accepted, timeout_seconds=timeout_seconds)
    )
    return links
