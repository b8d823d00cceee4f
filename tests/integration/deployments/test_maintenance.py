"""The maintenance flows against the session's database, storage and Prefect server:
purge-files, reconcile and settle-in-progress."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from prefect import get_client
from prefect.states import Cancelled
from sqlmodel import col, select

from campaign_trigger.config import get_settings
from campaign_trigger.flows.maintenance import purge_files, reconcile, settle_in_progress
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import (
    Storage,
    get_storage,
    messages_key,
    report_key,
    upload_key,
)
from campaign_trigger.store.models import (
    Channel,
    MessageSource,
    Outcome,
    Request,
    RequestMessage,
    RequestState,
    new_id,
)
from integration.client.running_stack import SeededTenant, seed_tenant
from support import ManagedProcess

pytestmark = [pytest.mark.slow]


@pytest.fixture
def tenant() -> SeededTenant:
    return seed_tenant(users=1)


@pytest.fixture
def storage() -> Storage:
    return get_storage(get_settings())


def add_request(
    tenant: SeededTenant,
    *,
    state: RequestState,
    age: timedelta = timedelta(0),
    send_in: timedelta = timedelta(days=30),
    **fields: Any,
) -> str:
    now = datetime.now(UTC)
    request = Request(
        id=new_id(),
        org_id=_org_id(tenant),
        campaign_id=tenant.campaign_id,
        requested_at=now - age,
        send_at=now + send_in,
        source=MessageSource.json,
        message_count=1,
        state=state,
        **fields,
    )
    with session_scope() as session:
        session.add(request)
        session.flush()
        session.add(
            RequestMessage(
                request_id=request.id,
                seq=0,
                user_id=tenant.users[0],
                template_variables={"first_name": "A", "order_id": "1"},
            )
        )
    return request.id


def _org_id(tenant: SeededTenant) -> int:
    from campaign_trigger.store.models import Campaign

    with session_scope() as session:
        campaign = session.get(Campaign, tenant.campaign_id)
        assert campaign is not None
        return campaign.org_id


def write(storage: Storage, key: str, *, days_old: float) -> str:
    with storage.open(key, "wb") as handle:
        handle.write(b"User\nu\n")
    local = storage.local_path(key)
    assert local is not None
    moment = (datetime.now(UTC) - timedelta(days=days_old)).timestamp()
    os.utime(local, (moment, moment))
    return key


def test_purge_files_deletes_old_files_of_ended_requests_only(
    prefect_server: ManagedProcess, tenant: SeededTenant, storage: Storage
) -> None:
    old_done = add_request(tenant, state=RequestState.processed, age=timedelta(days=40))
    old_waiting = add_request(tenant, state=RequestState.scheduled, age=timedelta(days=40))
    recent_done = add_request(tenant, state=RequestState.processed)
    purged = [
        write(storage, upload_key(old_done), days_old=40),
        write(storage, messages_key(old_done), days_old=40),
        write(storage, report_key(old_done, tenant.app_id), days_old=40),
        write(storage, upload_key("orphan-" + new_id()), days_old=40),  # refused upload
    ]
    kept = [
        write(storage, upload_key(old_waiting), days_old=40),  # sends in a month: keep
        write(storage, messages_key(old_waiting), days_old=40),
        write(storage, report_key(recent_done, tenant.app_id), days_old=1),
    ]
    result = purge_files(older_than_days=30)
    assert [key for key in purged if storage.exists(key)] == []
    assert [key for key in kept if storage.exists(key)] == kept
    assert result["deleted"] >= len(purged)
    assert result["kept_for_open_requests"] >= 1


def test_purge_files_deletes_what_a_create_left_once_a_day_old(
    prefect_server: ManagedProcess, tenant: SeededTenant, storage: Storage
) -> None:
    # A create killed before it stored its request leaves its upload and its message file,
    # named by a request id no row has: gone once a day old, not after the retention period.
    scheduled = add_request(tenant, state=RequestState.scheduled)
    never_stored, recent = new_id(), new_id()
    abandoned = [
        write(storage, upload_key(never_stored), days_old=1.1),
        write(storage, messages_key(never_stored), days_old=1.1),
    ]
    kept = [
        write(storage, upload_key(recent), days_old=0.5),  # not a day old yet
        write(storage, upload_key(scheduled), days_old=2),  # its request is stored
        write(storage, messages_key(scheduled), days_old=2),
        write(storage, "uploads/daily-2026-11-30.csv", days_old=2),  # an operator's, for send-batch
        write(storage, report_key(never_stored, tenant.app_id), days_old=2),  # only a request's
    ]
    result = purge_files(older_than_days=30)
    assert [key for key in abandoned if storage.exists(key)] == []
    assert [key for key in kept if storage.exists(key)] == kept
    assert result["abandoned"] >= len(abandoned)


def test_reconcile_schedules_the_outbox_and_corrects_mirrors_from_prefect(
    prefect_server: ManagedProcess, tenant: SeededTenant
) -> None:
    from campaign_trigger.deployments.register import ensure_deployments

    asyncio.run(ensure_deployments())
    in_outbox = add_request(tenant, state=RequestState.scheduled)
    first = asyncio.run(reconcile())
    assert first["runs_created"] >= 1
    with session_scope() as session:
        request = session.get(Request, in_outbox)
    assert request is not None
    assert request.flow_run_id is not None

    async def cancel_in_prefect(flow_run_id: str) -> None:  # as the UI may do
        async with get_client() as client:
            await client.set_flow_run_state(UUID(flow_run_id), Cancelled(), force=True)

    asyncio.run(cancel_in_prefect(request.flow_run_id))
    second = asyncio.run(reconcile())
    assert second["corrected"].get("canceled", 0) >= 1
    with session_scope() as session:
        corrected = session.get(Request, in_outbox)
    assert corrected is not None
    assert corrected.state == RequestState.canceled


def test_settle_in_progress_fails_stale_rows_and_rewrites_the_report(
    prefect_server: ManagedProcess, tenant: SeededTenant, storage: Storage
) -> None:
    request_id = add_request(
        tenant,
        state=RequestState.processed,
        age=timedelta(hours=3),
        send_in=timedelta(hours=-3),
    )
    key = report_key(request_id, tenant.app_id)
    with session_scope() as session:
        row = session.get(Request, request_id)
        assert row is not None
        row.report_paths = [key]
        session.add(row)
        session.add(
            Outcome(
                request_id=request_id,
                row_no=0,
                app_id=tenant.app_id,
                user_id=tenant.users[0],
                device_id="d1",
                channel=Channel.push,
                error_message="In progress",
            )
        )
    recent = add_request(tenant, state=RequestState.processed)
    with session_scope() as session:
        session.add(
            Outcome(
                request_id=recent,
                row_no=0,
                app_id=tenant.app_id,
                user_id=tenant.users[0],
                device_id="d1",
                channel=Channel.push,
                error_message="In progress",
            )
        )

    result = settle_in_progress(older_than_minutes=60)
    assert request_id in result["requests"]
    assert recent not in result["requests"]  # too recent: results may still come
    with storage.open(key, "rb") as handle:
        lines = handle.read().decode().splitlines()
    assert lines[1].endswith(",push,FPErrPushFailed")
    with session_scope() as session:
        rows = session.exec(
            select(Outcome).where(col(Outcome.request_id).in_([request_id, recent]))
        ).all()
        errors = {o.request_id: o.error_message for o in rows}
    assert errors == {request_id: "FPErrPushFailed", recent: "In progress"}
