"""Cancel, scheduled list and report links agree with the flow run's state in Prefect."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.context import FlowRunContext
from prefect.states import Cancelled, Cancelling, Crashed, Failed, Running
from sqlalchemy.engine import make_url
from sqlmodel import select

from campaign_trigger.config import get_settings
from campaign_trigger.deployments import upkeep, wakeup
from campaign_trigger.deployments.worker import DeliveryWorker, run_worker
from campaign_trigger.errors import CampaignNotFound, RequestNotFound, RequestStateError
from campaign_trigger.flows import deliver
from campaign_trigger.flows.deliver import _on_failure, deliver_request
from campaign_trigger.services import (
    housekeeping,
    lifecycle,
    prefect_runs,
    request_states,
    webhooks,
)
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request, RequestState, WebhookDelivery
from campaign_trigger.tasks import artifacts
from campaign_trigger.tasks.delivery import assemble_report
from delivery_support import (
    DeviceSpec,
    Tenant,
    add_devices,
    add_request,
    bulk_audience,
    drain,
    load_request,
    read_run,
    sandbox_stats,
    seed_tenant,
    state_name,
    sweeps_on_events_only,
    wait_for_state,
    worker_once_subscribed,
)
from support import ManagedProcess

pytestmark = [pytest.mark.slow]


async def cancel_request(*, org_id: int, request_id: str) -> Request:
    with session_scope() as session:
        return await lifecycle.cancel_request(session=session, org_id=org_id, request_id=request_id)


async def scheduled_requests(
    *, org_id: int, campaign_id: str, limit: int, offset: int, after: str | None = None
) -> tuple[list[Request], int]:
    with session_scope() as session:
        return await lifecycle.scheduled_requests(
            session=session,
            org_id=org_id,
            campaign_id=campaign_id,
            limit=limit,
            offset=offset,
            after=after,
        )


async def report_links(*, org_id: int, request_id: str) -> list[str]:
    with session_scope() as session:
        return await lifecycle.report_links(
            session=session, settings=get_settings(), org_id=org_id, request_id=request_id
        )


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def tenant_with_webhook() -> Tenant:
    """A tenant with a webhook: its requests' completion events are queued (never posted
    here)."""
    tenant = seed_tenant()
    with session_scope() as session:
        webhooks.register(
            session=session, settings=get_settings(), org_id=tenant.org_id, url="https://x.test/"
        )
    return tenant


def send_now(tenant: Tenant) -> tuple[str, list[str | None]]:
    """A send-now request to two new users, handed to Prefect: its id, their devices'
    tokens."""
    audience = bulk_audience(tenant, users=2, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=later(0))
    notify_new_request(request_id)
    return request_id, [device.token for device in audience.devices]


def queued_events(request_id: str) -> list[str]:
    with session_scope() as session:
        return list(
            session.exec(
                select(WebhookDelivery.event_type).where(WebhookDelivery.request_id == request_id)
            ).all()
        )


async def processed_with_one_event(tenant: Tenant, request_id: str) -> None:
    """The request is processed, its report links given, ``request.processed`` its only
    event."""
    assert load_request(request_id).state == RequestState.processed
    assert len(await report_links(org_id=tenant.org_id, request_id=request_id)) == 2
    assert queued_events(request_id) == ["request.processed"]


async def test_drain_creates_one_scheduled_run_per_request(deployed: ManagedProcess) -> None:
    tenant = seed_tenant()
    send_at = later(600)
    request_id = add_request(tenant, ["u1", "u2"], send_at=send_at)
    await drain()
    first = await read_run(request_id)
    assert first is not None
    assert first.state is not None
    assert first.state.type.value == "SCHEDULED"
    assert first.parameters == {"request_id": request_id}
    assert first.idempotency_key == request_id
    assert first.name == request_id
    assert first.state.state_details.scheduled_time is not None
    assert abs(first.state.state_details.scheduled_time.timestamp() - send_at.timestamp()) < 0.01
    await drain()  # nothing left in the outbox: no second run
    assert (await read_run(request_id)).id == first.id  # type: ignore[union-attr]


async def test_cancel_of_a_scheduled_run_cancels_it_in_prefect(deployed: ManagedProcess) -> None:
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    listed, total = await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
    )
    assert [r.id for r in listed] == [request_id]
    assert total == 1

    cancelled = await cancel_request(org_id=tenant.org_id, request_id=request_id)

    assert cancelled.id == request_id
    run = await read_run(request_id)
    assert run is not None
    assert run.state is not None
    assert run.state.type.value == "CANCELLED"
    assert load_request(request_id).state == RequestState.canceled
    with pytest.raises(RequestStateError, match="Request already canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)
    assert await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
    ) == ([], 0)


async def test_cancel_of_a_request_still_in_the_outbox_keeps_it_out_of_prefect(
    deployed: ManagedProcess,
) -> None:
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    _listed, total = await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
    )
    assert total == 1  # in the outbox counts as scheduled

    await cancel_request(org_id=tenant.org_id, request_id=request_id)
    await drain()

    assert load_request(request_id).flow_run_id is None
    assert load_request(request_id).state == RequestState.canceled


async def test_a_cancel_made_in_the_prefect_ui_is_the_same_cancel(
    deployed: ManagedProcess,
) -> None:
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    flow_run_id = load_request(request_id).flow_run_id
    assert flow_run_id is not None
    async with get_client() as client:  # what the UI's Cancel button does
        await client.set_flow_run_state(uuid.UUID(flow_run_id), Cancelling())

    assert await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
    ) == ([], 0)
    with pytest.raises(RequestStateError, match="Request already canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)
    assert load_request(request_id).state == RequestState.canceled


@pytest.mark.parametrize("deleted", ["before the cancel", "between its read and its claim"])
async def test_a_cancel_of_a_scheduled_request_whose_run_was_deleted_cancels_it(
    deployed: ManagedProcess, monkeypatch: pytest.MonkeyPatch, deleted: str
) -> None:
    """A run deleted in the Prefect UI never sends its request (nothing creates it
    again): the cancel answers from the mirror, which calls it scheduled, and cancels the
    request as asked, its event queued as any cancel's; it used to answer 500."""
    tenant = tenant_with_webhook()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    flow_run_id = load_request(request_id).flow_run_id
    assert flow_run_id is not None
    if deleted == "before the cancel":
        async with get_client() as client:  # what the UI's Delete does
            await client.delete_flow_run(UUID(flow_run_id))
    else:
        real_read_run = prefect_runs.read_run

        async def read_then_deleted(client: PrefectClient, run_id: str) -> FlowRun:
            run = await real_read_run(client, run_id)
            await client.delete_flow_run(UUID(run_id))
            return run

        monkeypatch.setattr(prefect_runs, "read_run", read_then_deleted)

    cancelled = await cancel_request(org_id=tenant.org_id, request_id=request_id)

    assert (cancelled.id, cancelled.state) == (request_id, RequestState.canceled)
    assert load_request(request_id).state == RequestState.canceled
    assert queued_events(request_id) == ["request.cancelled"]
    with pytest.raises(RequestStateError, match="Request already canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)


async def test_the_scheduled_list_with_a_run_deleted_in_the_ui_still_reads_prefect(
    deployed: ManagedProcess,
) -> None:
    """One request's run deleted in the Prefect UI, another's started: the list answers
    from Prefect, the deleted one listed as the mirror has it (scheduled, and cancellable:
    nothing will send it) and the started one left out. The deleted run's read failed the
    whole list, which fell back to the mirror at every call: the started request listed as
    scheduled, and never corrected."""
    tenant = seed_tenant()
    deleted = add_request(tenant, ["u1"], send_at=later(600))
    started = add_request(tenant, ["u2"], send_at=later(601))
    await drain()
    async with get_client() as client:
        await client.delete_flow_run(UUID(load_request(deleted).flow_run_id))
        await client.set_flow_run_state(
            UUID(load_request(started).flow_run_id), Running(), force=True
        )
    for _ in range(2):
        listed, total = await scheduled_requests(
            org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
        )
        assert ([r.id for r in listed], total) == ([deleted], 1)
    assert load_request(started).state == RequestState.running


async def test_a_cancel_of_a_started_request_whose_run_was_deleted_is_refused(
    deployed: ManagedProcess,
) -> None:
    """The mirror says the request started: what it sent is sent, it can't be canceled."""
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    with session_scope() as session:
        request_states.set_state(session=session, request_id=request_id, state=RequestState.running)
    async with get_client() as client:
        await client.delete_flow_run(UUID(load_request(request_id).flow_run_id))

    with pytest.raises(RequestStateError, match="Request can't be canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)
    assert load_request(request_id).state == RequestState.running


@pytest.mark.parametrize("run_state", [Cancelling, Cancelled])
async def test_a_cancel_of_a_request_processed_meanwhile_is_refused_as_started(
    deployed: ManagedProcess, monkeypatch: pytest.MonkeyPatch, run_state: Any
) -> None:
    """The API's cancel reads the request (running), then its run, which the UI's
    *Cancel* just set Cancelling (or which ended Cancelled) after the report marked the
    request processed in between: the worker completes such a run
    (``upkeep.cancel_unless_processed``). The request was processed, so it can't be
    canceled; it was never "already canceled", and it stays processed."""
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    with session_scope() as session:
        request_states.set_state(session=session, request_id=request_id, state=RequestState.running)
    async with get_client() as client:
        await client.set_flow_run_state(
            UUID(load_request(request_id).flow_run_id), run_state(), force=True
        )
    real_read_run = prefect_runs.read_run

    async def report_first(client: PrefectClient, flow_run_id: str) -> Any:
        with session_scope() as session:  # the report lands between the two reads
            request_states.set_state(
                session=session, request_id=request_id, state=RequestState.processed
            )
        return await real_read_run(client, flow_run_id)

    monkeypatch.setattr(prefect_runs, "read_run", report_first)
    with pytest.raises(RequestStateError, match="Request can't be canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)
    assert load_request(request_id).state == RequestState.processed
    monkeypatch.setattr(prefect_runs, "read_run", real_read_run)
    with pytest.raises(RequestStateError, match="Request can't be canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)  # read processed


async def as_the_engine_calls(hook: Any, run: FlowRun) -> None:
    """Prefect's flow engine calls a hook on the run's event loop, awaiting what it gives."""
    result = hook(deliver_request, run, Failed())
    if asyncio.iscoroutine(result):
        await result


async def test_the_failure_hook_waits_for_the_database_off_the_event_loop(
    deployed: ManagedProcess,
) -> None:
    """A failed or crashed run's hook marks its request failed. While another writer holds
    the database's write lock, the event loop it runs on (every run of the worker process,
    its cancel watch) goes on; the request is marked once the lock is released."""
    tenant = seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    with session_scope() as session:
        request_states.set_state(session=session, request_id=request_id, state=RequestState.running)
    run = FlowRun(flow_id=uuid.uuid4(), parameters={"request_id": request_id})
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    writer = sqlite3.connect(make_url(get_settings().database_url).database or "")
    try:
        writer.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        ticker = asyncio.create_task(tick())
        hook = asyncio.create_task(as_the_engine_calls(_on_failure, run))
        await asyncio.sleep(0.5)
        assert not hook.done()
        assert ticks >= 5  # the loop went on (a blocked loop: none, and the hook done)
    finally:
        writer.rollback()
        writer.close()
    await asyncio.wait_for(hook, timeout=30)
    ticker.cancel()
    assert load_request(request_id).state == RequestState.failed


async def test_a_run_whose_worker_died_is_still_running_for_the_tenant(
    deployed: ManagedProcess,
) -> None:
    """Marked dead (Crashed, ``Worker lost``), a run waits for a live worker to take it
    over and finish it: a report read or the reconciler must not call its request failed
    (nor queue a ``request.failed`` event before its ``request.processed``)."""
    tenant = tenant_with_webhook()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    await drain()
    run = await wait_for_state(request_id, "SCHEDULED", timeout=30)
    with session_scope() as session:  # as its worker left it: running
        request_states.set_state(session=session, request_id=request_id, state=RequestState.running)
    dead: State[None] = Crashed(
        name=prefect_runs.DEAD_RUN_STATE_NAME, message=prefect_runs.DEAD_RUN_MESSAGE
    )
    async with get_client() as client:
        await client.set_flow_run_state(run.id, dead, force=True)
        try:
            with pytest.raises(RequestStateError, match="Request not processed yet"):
                await report_links(org_id=tenant.org_id, request_id=request_id)
            with session_scope() as session:
                await housekeeping.correct_mirrors(session=session, client=client)
        finally:  # no worker of a later test takes it over
            await client.set_flow_run_state(run.id, Cancelled(), force=True)
    assert load_request(request_id).state == RequestState.running
    assert queued_events(request_id) == []


async def test_a_page_asks_prefect_about_the_requests_up_to_its_end_only(
    deployed: ManagedProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = seed_tenant()
    total = prefect_runs.PAGE_LIMIT + 5
    request_ids = [add_request(tenant, ["u1"], send_at=later(600 + n)) for n in range(total)]
    while await drain():
        pass
    async with get_client() as client:  # two cancelled in the UI, one in each window
        for n in (0, prefect_runs.PAGE_LIMIT + 1):
            flow_run_id = load_request(request_ids[n]).flow_run_id
            assert flow_run_id is not None
            await client.set_flow_run_state(uuid.UUID(flow_run_id), Cancelling())
    asked: list[int] = []
    scheduled_among = prefect_runs.scheduled_among

    async def counted(client: PrefectClient, run_ids: Sequence[str]) -> set[str]:
        asked.append(len(run_ids))
        return await scheduled_among(client, run_ids)

    monkeypatch.setattr(prefect_runs, "scheduled_among", counted)

    first, counted_total = await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=2, offset=0
    )
    assert [r.id for r in first] == request_ids[1:3]
    # as many runs as the page lacks, not the backlog: two, then one for the cancelled
    assert asked == [2, 1]
    assert counted_total == total - 1  # the second window's cancel is not seen yet
    assert load_request(request_ids[0]).state == RequestState.canceled

    asked.clear()
    last, counted_total = await scheduled_requests(
        org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=10, offset=total - 5
    )
    assert [r.id for r in last] == request_ids[-3:]
    # the page's end is past the first window (PAGE_LIMIT at most); the first request,
    # corrected, is not open now
    assert asked == [prefect_runs.PAGE_LIMIT, 4]
    assert counted_total == total - 2
    assert load_request(request_ids[prefect_runs.PAGE_LIMIT + 1]).state == RequestState.canceled


async def test_pages_after_a_request_skip_nothing_while_each_page_is_cancelled(
    deployed: ManagedProcess,
) -> None:
    # A back-end cancelling every request it lists, page by page: an offset skipped the
    # requests that moved up into the page just read; a page after its last request not.
    tenant = seed_tenant()
    request_ids = [add_request(tenant, ["u1"], send_at=later(600 + n)) for n in range(7)]
    while await drain():
        pass
    seen: list[str] = []
    after: str | None = None
    totals: list[int] = []
    while True:
        page, total = await scheduled_requests(
            org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=3, offset=0, after=after
        )
        totals.append(total)
        if not page:
            break
        for request in page:
            await cancel_request(org_id=tenant.org_id, request_id=request.id)
        seen += [request.id for request in page]
        after = page[-1].id
    assert seen == request_ids
    assert totals == [7, 4, 1, 0]  # what is left scheduled, every page
    # the cursor is one of this campaign's requests, in any state (cancelled ones here)
    with pytest.raises(RequestNotFound, match="The request nope was not found"):
        await scheduled_requests(
            org_id=tenant.org_id, campaign_id=tenant.campaign_id, limit=3, offset=0, after="nope"
        )
    other = seed_tenant()
    with pytest.raises(RequestNotFound):
        await scheduled_requests(
            org_id=other.org_id, campaign_id=other.campaign_id, limit=3, offset=0, after=after
        )


async def test_unknown_and_foreign_requests_and_campaigns_are_not_found(
    deployed: ManagedProcess,
) -> None:
    tenant, other = seed_tenant(), seed_tenant()
    request_id = add_request(tenant, ["u1"], send_at=later(600))
    with pytest.raises(RequestNotFound):
        await cancel_request(org_id=other.org_id, request_id=request_id)
    with pytest.raises(RequestNotFound):
        await report_links(org_id=tenant.org_id, request_id="nope")
    with pytest.raises(
        CampaignNotFound, match=f"Campaign with identifier {tenant.campaign_id} was not found"
    ):
        await scheduled_requests(
            org_id=other.org_id, campaign_id=tenant.campaign_id, limit=10, offset=0
        )


async def test_report_links_wait_for_completion_then_sign_every_app(worker: None) -> None:
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=3, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=later(600))
    with pytest.raises(RequestStateError, match="Request not processed yet"):
        await report_links(org_id=tenant.org_id, request_id=request_id)

    request_id = add_request(tenant, audience.users, send_at=later(0))
    notify_new_request(request_id)
    await wait_for_state(request_id, "COMPLETED", timeout=60)

    links = await report_links(org_id=tenant.org_id, request_id=request_id)
    assert len(links) == 2
    assert all("/files/reports/" in link and "signature=" in link for link in links)
    with pytest.raises(RequestStateError, match="Request can't be canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)


async def test_a_summary_not_shown_leaves_a_processed_request_processed(
    worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The summary artifact is published after the report marked the request processed:
    # its failure failed the run, whose hook then marked the request failed and queued
    # request.failed after request.processed, for messages all delivered.
    async def refused(**kwargs: object) -> None:
        raise OSError("the Prefect API refused the artifact")

    monkeypatch.setattr(artifacts, "acreate_markdown_artifact", refused)
    tenant = tenant_with_webhook()
    request_id, _ = send_now(tenant)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"
    await processed_with_one_event(tenant, request_id)


async def test_a_run_taken_over_after_its_report_announces_it_once(
    worker: None, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker that died between the report (the request processed, request.processed
    # queued) and Completed: Prefect marks its run dead and a live worker runs it again.
    # The rerun sent nothing again, but its claim called the request running (as did a
    # report read meanwhile) and its report queued a second request.processed, of a new
    # id, which a tenant's de-duplication by id let through.
    tenant = tenant_with_webhook()
    request_id, tokens = send_now(tenant)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"
    seen: list[RequestState] = []  # by the rerun, after its report

    async def read_in_the_rerun(*, request_id: str, summary: Any) -> None:
        with pytest.raises(RequestStateError, match="Request not processed yet"):
            await report_links(org_id=tenant.org_id, request_id=request_id)
        seen.append(load_request(request_id).state)

    monkeypatch.setattr(artifacts, "publish_summary", read_in_the_rerun)
    dead: State[None] = Crashed(
        name=prefect_runs.DEAD_RUN_STATE_NAME, message=prefect_runs.DEAD_RUN_MESSAGE
    )
    async with get_client() as client:
        await client.set_flow_run_state(run.id, dead, force=True)
    async with asyncio.timeout(60):
        while not seen:
            await asyncio.sleep(0.2)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=30)
    assert state_name(run) == "COMPLETED"
    assert seen == [RequestState.processed]
    await processed_with_one_event(tenant, request_id)
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(token) for token in tokens] == [1] * len(tokens)


@pytest.mark.parametrize("seen_by", ["cancel watch", "run's end"])
async def test_a_cancel_made_in_the_ui_after_the_report_lets_the_run_complete(
    worker: None, monkeypatch: pytest.MonkeyPatch, seen_by: str
) -> None:
    # The UI's Cancel landing between the report (the request processed, request.processed
    # queued) and the run's Completed, seen by the worker's cancel watch while the run
    # ends, or at its end (Prefect refuses Completed to a Cancelling run): the run ended
    # Cancelled, and the request canceled, request.cancelled queued after
    # request.processed. Nothing is left to stop: the run completes, its request
    # processed, one event.
    watch = upkeep.stop_cancelled_runs
    cancelled: list[UUID] = []
    looked = asyncio.Event()  # the cancel watch ended the run's Cancelling

    async def watching(workers: list[Any], client: PrefectClient) -> None:
        if seen_by == "run's end":
            return
        await watch(workers, client)
        if cancelled:
            run = await client.read_flow_run(cancelled[0])
            if run.state_type != StateType.CANCELLING:
                looked.set()

    async def cancelled_in_the_ui(*, request_id: str, summary: Any) -> None:
        context = FlowRunContext.get()
        assert context is not None
        assert context.flow_run is not None
        cancelled.append(context.flow_run.id)
        async with get_client() as client:
            await client.set_flow_run_state(context.flow_run.id, Cancelling())
        with pytest.raises(RequestStateError, match="Request not processed yet"):
            await report_links(org_id=tenant.org_id, request_id=request_id)  # no correction
        if seen_by == "cancel watch":
            await asyncio.wait_for(looked.wait(), timeout=30)

    monkeypatch.setattr(upkeep, "stop_cancelled_runs", watching)
    monkeypatch.setattr(artifacts, "publish_summary", cancelled_in_the_ui)
    tenant = tenant_with_webhook()
    request_id, _ = send_now(tenant)
    run = await wait_for_state(request_id, "COMPLETED", "CANCELLED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"
    assert cancelled
    if seen_by == "cancel watch":  # (it may read the run after the test saw it Completed)
        await asyncio.wait_for(looked.wait(), timeout=10)
    else:
        assert not looked.is_set()
    await processed_with_one_event(tenant, request_id)


async def test_a_cancel_made_in_the_ui_after_every_chunk_was_sent_lets_the_report_be_written(
    worker: None, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The UI's Cancel landing after the last chunk was recorded, before the report: nothing
    # is left to stop. The cancel watch stopped the run as it began its report: the
    # request ended canceled with every message sent, and had no report.
    watch = upkeep.stop_cancelled_runs
    cancelled = asyncio.Event()
    looked = asyncio.Event()  # the cancel watch looked at the run Cancelling

    async def watching(workers: list[Any], client: PrefectClient) -> None:
        after_cancel = cancelled.is_set()
        await watch(workers, client)
        if after_cancel:
            looked.set()

    async def cancelled_in_the_ui(plan: Any) -> Any:
        context = FlowRunContext.get()
        assert context is not None
        assert context.flow_run is not None
        async with get_client() as client:
            await client.set_flow_run_state(context.flow_run.id, Cancelling())
        cancelled.set()
        await asyncio.wait_for(looked.wait(), timeout=30)
        return await assemble_report(plan)

    monkeypatch.setattr(upkeep, "stop_cancelled_runs", watching)
    monkeypatch.setattr(deliver, "assemble_report", cancelled_in_the_ui)
    tenant = tenant_with_webhook()
    request_id, tokens = send_now(tenant)
    run = await wait_for_state(request_id, "COMPLETED", "CANCELLED", "FAILED", timeout=60)
    assert state_name(run) == "COMPLETED"
    assert looked.is_set()
    await processed_with_one_event(tenant, request_id)
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(token) for token in tokens] == [1] * len(tokens)


@pytest.mark.parametrize("seen_by", ["event", "watch-without-events"])
async def test_a_run_cancelled_in_the_ui_while_running_is_stopped(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch, seen_by: str
) -> None:
    """Stopped before its end (the run's own end would be Cancelled too: its Completed
    is refused), as the server announces it Cancelling (the watch never looks on its
    own), or, with no event stream, by the watch looking every ``NO_STREAM_SECONDS``."""
    monkeypatch.setenv("CT_CHUNK_SIZE", "1")
    get_settings.cache_clear()
    if seen_by == "event":
        subscribed = sweeps_on_events_only(monkeypatch)
    else:
        subscribed = asyncio.Event()
        subscribed.set()
        monkeypatch.setattr(wakeup, "get_events_subscriber", _no_event_stream)
        monkeypatch.setattr(upkeep, "FALLBACK_SECONDS", 3600.0)
    tenant = tenant_with_webhook()
    audience = bulk_audience(tenant, users=300, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    try:
        async with worker_once_subscribed(subscribed, poll_seconds=0.2, heartbeat_seconds=1):
            request_id = add_request(tenant, audience.users, send_at=later(0))
            await drain()
            run = await wait_for_state(request_id, "RUNNING", timeout=30)
            async with get_client() as client:
                await client.set_flow_run_state(run.id, Cancelling())
            run = await wait_for_state(request_id, "CANCELLED", "COMPLETED", timeout=30)
    finally:
        get_settings.cache_clear()
    assert state_name(run) == "CANCELLED"
    per_token = sandbox_stats(sandbox_url)["per_token"]
    sent = sum(per_token.get(device.token, 0) for device in audience.devices)
    assert sent < len(audience.devices)  # stopped before its end (perhaps before a send)
    assert load_request(request_id).state == RequestState.canceled
    assert queued_events(request_id) == ["request.cancelled"]  # never a failure first
    with pytest.raises(RequestStateError, match="Request already canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)


def _cancelled_before_its_start(
    run: FlowRun, request_id: str, devices: Sequence[DeviceSpec], sandbox_url: str
) -> None:
    """The run ended Cancelled unstarted, nothing sent, the request canceled, one event."""
    assert run.state is not None
    assert run.state.message == "Cancelled before its start"
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert sum(per_token.get(device.token, 0) for device in devices) == 0
    assert load_request(request_id).state == RequestState.canceled
    assert queued_events(request_id) == ["request.cancelled"]


async def test_a_run_cancelled_in_the_ui_while_its_worker_waits_for_its_time_sends_nothing(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claims a run scheduled ahead within its prefetch and holds it, Pending,
    until just before its time (``worker.until_start``): a cancel in the UI meanwhile
    stops that wait, the run ends Cancelled without ever Running, and nothing goes out
    at its time."""
    subscribed = sweeps_on_events_only(monkeypatch)
    tenant = tenant_with_webhook()
    audience = bulk_audience(tenant, users=3, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    assert audience.devices
    stop = asyncio.Event()
    worker = asyncio.create_task(  # claims up to 20 s ahead: a wait long enough to hit
        run_worker(concurrency=2, stop=stop, poll_seconds=0.2, prefetch_seconds=20)
    )
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=60)
        # 15 s: on a loaded machine (CI, 3 Dec) the claim, the cancel and its stop took
        # 9.3 s, past a time 8 s ahead.
        send_at = later(15)
        request_id = add_request(tenant, audience.users, send_at=send_at)
        await drain()
        run = await wait_for_state(request_id, "PENDING", timeout=10)  # claimed, waiting
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling())
        run = await wait_for_state(request_id, "CANCELLED", timeout=10)
        assert datetime.now(UTC) < send_at  # stopped while it waited
        await asyncio.sleep((send_at - datetime.now(UTC)).total_seconds() + 1.5)
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=60)
    async with get_client() as client:
        states = [state.type for state in await client.read_flow_run_states(run.id)]
    assert StateType.RUNNING not in states
    _cancelled_before_its_start(run, request_id, audience.devices, sandbox_url)
    with pytest.raises(RequestStateError, match="Request already canceled"):
        await cancel_request(org_id=tenant.org_id, request_id=request_id)


async def test_a_run_whose_start_failed_in_its_worker_is_ended_by_a_cancel_there(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose execution failed in its worker before Prefect's engine began it stays
    claimed (Pending) by that worker, which runs it no more: a cancel then set it
    Cancelling, and no worker stopped it, so it stayed so for good (a share in CI,
    3 Dec). The cancel watch of the worker that claimed it ends it Cancelled."""
    subscribed = sweeps_on_events_only(monkeypatch)
    failed = asyncio.Event()

    async def failing(self: DeliveryWorker, flow_run: FlowRun) -> None:
        failed.set()
        raise RuntimeError("a bug before the run's start")

    monkeypatch.setattr(DeliveryWorker, "_flow_of", failing)
    tenant = tenant_with_webhook()
    audience = bulk_audience(tenant, users=3, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(concurrency=2, stop=stop, poll_seconds=0.2))
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=60)
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
        await drain()
        await asyncio.wait_for(failed.wait(), timeout=30)
        run = await wait_for_state(request_id, "PENDING", timeout=5)  # claimed, left so
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling())
        run = await wait_for_state(request_id, "CANCELLED", timeout=10)
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=60)
    _cancelled_before_its_start(run, request_id, audience.devices, sandbox_url)


def _no_event_stream(**kwargs: object) -> contextlib.AbstractAsyncContextManager[object]:
    raise OSError("no event stream")


async def test_a_run_stopped_by_its_cancel_leaves_the_other_runs_of_its_worker_running(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One of two runs a worker executes is cancelled in the UI while both send: the
    other completes, every one of its devices gets its message once, and the worker goes
    on claiming (a third request, created after the cancel, is delivered)."""
    monkeypatch.setenv("CT_CHUNK_SIZE", "1")
    get_settings.cache_clear()
    subscribed = sweeps_on_events_only(monkeypatch)
    tenant = tenant_with_webhook()
    prefix = uuid.uuid4().hex[:6]
    cancelled, kept, later_one = (
        bulk_audience(tenant, users=users, prefix=f"{prefix}{n}")
        for n, users in enumerate((300, 60, 3))
    )
    for audience in (cancelled, kept, later_one):
        add_devices(audience.devices)
    try:
        async with worker_once_subscribed(subscribed, poll_seconds=0.2, heartbeat_seconds=1):
            cancelled_id = add_request(tenant, cancelled.users, send_at=later(0))
            kept_id = add_request(tenant, kept.users, send_at=later(0))
            await drain()
            run = await wait_for_state(cancelled_id, "RUNNING", timeout=30)
            await wait_for_state(kept_id, "RUNNING", timeout=30)
            async with get_client() as client:
                await client.set_flow_run_state(run.id, Cancelling())
            run = await wait_for_state(cancelled_id, "CANCELLED", "COMPLETED", timeout=30)
            ended = ("COMPLETED", "CRASHED", "FAILED")
            kept_run = await wait_for_state(kept_id, *ended, timeout=60)
            later_id = add_request(tenant, later_one.users, send_at=later(0))
            await drain()
            later_run = await wait_for_state(later_id, *ended, timeout=30)
    finally:
        get_settings.cache_clear()
    assert state_name(run) == "CANCELLED"
    assert state_name(kept_run) == "COMPLETED"
    assert state_name(later_run) == "COMPLETED"
    per_token = sandbox_stats(sandbox_url)["per_token"]
    for audience in (kept, later_one):
        assert [per_token.get(device.token, 0) for device in audience.devices] == [1] * len(
            audience.devices
        )
    assert load_request(kept_id).state == RequestState.processed


async def test_a_worker_stopping_claims_nothing_more_and_ends_what_it_runs(
    deployed: ManagedProcess, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop (SIGTERM's): the request the worker runs is delivered to its end, and one
    made meanwhile is left to another worker. Claimed during the wait, it was cancelled
    with the worker's task group if still running once the first had ended: crashed
    mid-send, its request failed."""
    monkeypatch.setenv("CT_CHUNK_SIZE", "1")
    get_settings.cache_clear()
    subscribed = sweeps_on_events_only(monkeypatch)
    tenant = tenant_with_webhook()
    prefix = uuid.uuid4().hex[:6]
    running, made_after = (
        bulk_audience(tenant, users=users, prefix=f"{prefix}{n}")
        for n, users in enumerate((120, 3))
    )
    for audience in (running, made_after):
        add_devices(audience.devices)
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(concurrency=2, stop=stop, poll_seconds=0.2, heartbeat_seconds=1)
    )
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=60)
        running_id = add_request(tenant, running.users, send_at=later(0))
        await drain()
        await wait_for_state(running_id, "RUNNING", timeout=30)
        stop.set()
        after_id = add_request(tenant, made_after.users, send_at=later(0))
        await drain()
        # the second request due while the first still runs: a worker still claiming
        # would take it at its next poll
        assert state_name(await read_run(running_id)) == "RUNNING"
        await asyncio.wait_for(worker, timeout=120)
    finally:
        stop.set()
        get_settings.cache_clear()
    assert state_name(await read_run(running_id)) == "COMPLETED"
    after = await read_run(after_id)
    assert after is not None
    assert after.state is not None
    assert after.state.type == StateType.SCHEDULED  # never claimed here
    per_token = sandbox_stats(sandbox_url)["per_token"]
    assert [per_token.get(d.token, 0) for d in running.devices] == [1] * len(running.devices)
    assert sum(per_token.get(d.token, 0) for d in made_after.devices) == 0
