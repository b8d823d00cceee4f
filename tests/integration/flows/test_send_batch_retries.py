"""A send-batch run that runs again sends its batch once: as the subflow of a retried
parent flow (Prefect gives it a new flow run). The flows run in this process, on the
session's Prefect server; their delivery runs are never picked up."""

from __future__ import annotations

import pytest
from prefect import flow
from sqlmodel import col, select

from campaign_trigger.flows import send_batch
from campaign_trigger.flows.send_batch import Message, SendBatchInput
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request
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
    assert first is not None and second is not None
    assert first != second
    assert sorted(stored_requests(tenant.campaign_id)) == sorted([first, second])
