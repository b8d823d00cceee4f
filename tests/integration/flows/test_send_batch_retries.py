"""A send-batch run that runs again sends its batch once: as the subflow of a retried
parent flow (Prefect gives it a new flow run), and when retried itself (the Prefect
UI's Retry) after its organisation's quota is spent. The flows run in this process,
on the session's Prefect server; their delivery runs are never picked up."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow, get_client
from prefect.client.schemas.objects import StateType
from prefect.flow_engine import run_flow
from prefect.states import AwaitingRetry
from sqlmodel import col, select

from campaign_trigger.errors import ServiceUnavailable
from campaign_trigger.flows import send_batch
from campaign_trigger.flows.send_batch import Message, SendBatchInput, SendBatchResult
from campaign_trigger.services import quota, requests
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Organisation, Request
from campaign_trigger.tasks import send_batch as steps
from integration.client.running_stack import SeededTenant, seed_tenant
from support import ManagedProcess

pytestmark = [pytest.mark.slow]


def batch_for(tenant: SeededTenant) -> SendBatchInput:
    return SendBatchInput(
        campaign_id=tenant.campaign_id,
        messages=[
            Message(user_id=u, template_variables={"first_name": f"N{n}", "order_id": f"O{n}"})
            for n, u in enumerate(tenant.users)
        ],
    )


def stored_requests(campaign_id: str) -> list[str]:
    with session_scope() as session:
        return list(
            session.exec(select(Request.id).where(col(Request.campaign_id) == campaign_id)).all()
        )


def quota_left(campaign_id: str) -> int:
    with session_scope() as session:
        org_id = requests.campaign_owner(session=session, campaign_id=campaign_id)
        return quota.remaining(session=session, org_id=org_id)


def set_quota(campaign_id: str, limit: int) -> None:
    with session_scope() as session:
        org_id = requests.campaign_owner(session=session, campaign_id=campaign_id)
        org = session.get(Organisation, org_id)
        assert org is not None
        org.request_quota = limit
        session.add(org)
        session.commit()


def test_a_parent_flow_retried_after_send_batch_completed_sends_the_batch_once(
    deployed: ManagedProcess,
) -> None:
    tenant = seed_tenant()
    batch = batch_for(tenant)
    request_ids: list[str | None] = []

    @flow(retries=1, retry_delay_seconds=0, persist_result=False)
    def nightly() -> None:
        request_ids.append(send_batch(batch).request_id)
        if len(request_ids) == 1:
            raise RuntimeError("the next step failed")

    nightly()
    assert len(request_ids) == 2
    assert request_ids[1] == request_ids[0]
    assert stored_requests(tenant.campaign_id) == [request_ids[0]]


def test_a_parent_flow_calling_send_batch_twice_stores_two_requests(
    deployed: ManagedProcess,
) -> None:
    tenant = seed_tenant()
    batch = batch_for(tenant)

    @flow(persist_result=False)
    def twice() -> list[str | None]:
        return [send_batch(batch).request_id, send_batch(batch).request_id]

    first, second = twice()
    assert first is not None
    assert second is not None
    assert first != second
    assert sorted(stored_requests(tenant.campaign_id)) == sorted([first, second])


def test_a_retried_run_finds_its_request_before_the_quota_and_deployment_checks(
    deployed: ManagedProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = seed_tenant(quota=1)
    state = send_batch(batch_for(tenant), return_state=True)
    assert state.type == StateType.COMPLETED, state
    first = state.result()
    assert isinstance(first, SendBatchResult)
    assert quota_left(tenant.campaign_id) == 0  # spent by the first run

    async def undeployed() -> None:
        raise ServiceUnavailable("no deliver-request deployment")

    def retry_like_the_ui() -> Any:
        flow_run_id = state.state_details.flow_run_id
        assert flow_run_id is not None
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, AwaitingRetry(), force=True)
            flow_run = client.read_flow_run(flow_run_id)
        return run_flow(send_batch, flow_run=flow_run)  # its parameters, as a worker does

    assert retry_like_the_ui().request_id == first.request_id  # not refused for the quota

    set_quota(tenant.campaign_id, 2)
    assert quota_left(tenant.campaign_id) == 1
    monkeypatch.setattr(steps, "_check_delivery_is_deployed", undeployed)
    assert retry_like_the_ui().request_id == first.request_id  # nor for the deployment
    assert quota_left(tenant.campaign_id) == 1  # a replay takes no unit
    assert stored_requests(tenant.campaign_id) == [first.request_id]
