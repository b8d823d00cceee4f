"""Seeding and waiting helpers of the delivery tests (integration and e2e tiers).

Tenants, apps and devices are written straight into the store tables; requests go
through ``create_request``, the service the API calls (left in the outbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, TaskRun
from prefect.events.clients import get_events_subscriber
from sqlalchemy import insert

from campaign_trigger.deployments import upkeep, wakeup
from campaign_trigger.deployments.worker import DeliveryWorker, run_worker
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.services.uploads import StoredUpload
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import (
    App,
    Campaign,
    CampaignApp,
    CampaignState,
    Channel,
    Device,
    Organisation,
    Platform,
    Request,
)

TITLE = "Hello {{ first_name }}"
BODY = "Order {{ order_id }} is on its way"


@dataclass
class Tenant:
    org_id: int
    campaign_id: str
    android: str
    ios: str
    channel: Channel

    @property
    def app_ids(self) -> list[str]:
        return [self.android, self.ios]


@dataclass
class DeviceSpec:
    app_id: str
    device_id: str
    user_id: str
    token: str | None
    opted_in: bool = True
    logged_in: bool = True
    unregistered: bool = False


@dataclass
class Audience:
    devices: list[DeviceSpec] = field(default_factory=list)
    users: list[str] = field(default_factory=list)


def seed_tenant(*, channel: Channel = Channel.push) -> Tenant:
    tag = uuid.uuid4().hex[:8]
    with session_scope() as session:
        org = Organisation(name=f"org-{tag}", request_quota=10**6)
        session.add(org)
        session.flush()
        assert org.id is not None
        android = App(
            app_id=f"android-{tag}",
            org_id=org.id,
            platform=Platform.android,
            sdk_key=f"sdk-a-{tag}",
        )
        ios = App(app_id=f"ios-{tag}", org_id=org.id, platform=Platform.ios, sdk_key=f"sdk-i-{tag}")
        campaign = Campaign(
            org_id=org.id,
            channel=channel,
            state=CampaignState.started,
            title=TITLE,
            body=BODY,
            variables=["first_name", "order_id"],
        )
        session.add_all([android, ios, campaign])
        session.flush()
        session.add_all(
            [
                CampaignApp(campaign_id=campaign.id, app_id=android.app_id),
                CampaignApp(campaign_id=campaign.id, app_id=ios.app_id),
            ]
        )
        return Tenant(
            org_id=org.id,
            campaign_id=campaign.id,
            android=android.app_id,
            ios=ios.app_id,
            channel=channel,
        )


def add_devices(devices: Sequence[DeviceSpec]) -> None:
    now = datetime.now(UTC)
    rows = [
        {
            "app_id": d.app_id,
            "device_id": d.device_id,
            "user_id": d.user_id,
            "push_token": d.token,
            "opted_in": d.opted_in,
            "logged_in": d.logged_in,
            "unregistered_at": now if d.unregistered else None,
            "uninstalled_at": None,
            "updated_at": now,
        }
        for d in devices
    ]
    with session_scope() as session:
        session.execute(insert(Device), rows)


def every_outcome_audience(tenant: Tenant) -> Audience:
    """Users covering every outcome kind, on both apps; tokens unique per test."""
    tag = uuid.uuid4().hex[:6]
    a, i = tenant.android, tenant.ios
    aud = Audience()

    def dev(app: str, user: str, token: str | None, **kw: Any) -> None:
        aud.devices.append(DeviceSpec(app, f"dev-{user}-{app[:3]}", user, token, **kw))

    dev(a, f"u-ok-{tag}", f"ok-a-{tag}")
    dev(i, f"u-ok-{tag}", f"ok-i-{tag}")
    dev(a, f"u-flaky-{tag}", f"flaky-a-{tag}")
    dev(a, f"u-unreg-{tag}", f"unregistered-a-{tag}")
    dev(i, f"u-expired-{tag}", f"expired-i-{tag}")
    dev(a, f"u-invalid-{tag}", f"invalid-a-{tag}")
    dev(a, f"u-fail-{tag}", f"fail-a-{tag}")
    dev(a, f"u-optout-{tag}", f"optout-a-{tag}", opted_in=False)
    dev(i, f"u-loggedout-{tag}", f"loggedout-i-{tag}", logged_in=False)
    dev(a, f"u-gone-{tag}", f"gone-a-{tag}", unregistered=True)
    aud.users = [*sorted({d.user_id for d in aud.devices}), f"u-nodevice-{tag}"]
    return aud


def bulk_audience(tenant: Tenant, *, users: int, prefix: str) -> Audience:
    """``users`` users with one Android and one iOS device each, all deliverable."""
    aud = Audience(users=[f"{prefix}-u{n}" for n in range(users)])
    for user in aud.users:
        aud.devices.append(DeviceSpec(tenant.android, f"{user}-a", user, f"{user}-ta"))
        aud.devices.append(DeviceSpec(tenant.ios, f"{user}-i", user, f"{user}-ti"))
    return aud


def _create(tenant: Tenant, trigger: TriggerInput, *, chunk_size: int | None) -> str:
    """A request through the service the API calls: checked, stored, in the outbox."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.store.files import get_storage

    settings = get_settings()
    if chunk_size is not None:
        settings = settings.model_copy(update={"chunk_size": chunk_size})
    with session_scope() as session:
        return create_request(
            session=session,
            settings=settings,
            storage=get_storage(settings),
            org_id=tenant.org_id,
            request_id=uuid.uuid4().hex,
            trigger=trigger,
        )


def add_request(
    tenant: Tenant,
    users: Sequence[str],
    *,
    send_at: datetime,
    chunk_size: int | None = None,
) -> str:
    """A JSON request as create_request leaves it: persisted, in the outbox."""
    messages = [
        {"user_id": user, "template_variables": {"first_name": f"N{n}", "order_id": f"=O{n}"}}
        for n, user in enumerate(users)
    ]
    trigger = TriggerInput(
        campaign_id=tenant.campaign_id, send_at=send_at.isoformat(), messages=messages
    )
    return _create(tenant, trigger, chunk_size=chunk_size)


async def drain() -> int:
    """Create the flow runs of the outbox now (what the API's drainer does when notified)."""
    from campaign_trigger.services.scheduling import drain_outbox

    with session_scope() as session:
        return await drain_outbox(session=session)


def load_request(request_id: str) -> Request:
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        return request


async def read_run(request_id: str) -> FlowRun | None:
    flow_run_id = load_request(request_id).flow_run_id
    if flow_run_id is None:
        return None
    async with get_client() as client:
        return await client.read_flow_run(uuid.UUID(flow_run_id))


def state_name(run: FlowRun | None) -> str | None:
    """The run's state type, e.g. ``"COMPLETED"`` (None if no run or no state)."""
    if run is None or run.state is None:
        return None
    return str(run.state.type.value)


async def wait_for_state(request_id: str, *types: str, timeout: float = 60) -> FlowRun:
    """Poll until the request's flow run is in one of the state types (names)."""
    deadline = time.monotonic() + timeout
    run: FlowRun | None = None
    while time.monotonic() < deadline:
        run = await read_run(request_id)
        if run is not None and run.state is not None and run.state.type.value in types:
            return run
        await asyncio.sleep(0.25)
    raise AssertionError(f"run of {request_id} not in {types}: {run and run.state}")


async def recorded_task_runs(
    flow_run_ids: Sequence[uuid.UUID], done: Callable[[list[TaskRun]], bool], timeout: float = 10
) -> list[TaskRun]:
    """The task runs of ``flow_run_ids`` once ``done`` says they are all recorded: the
    embedded server records task runs from their events about once a second
    (``deployments/prefect_server.py``), so a run can end before its task runs show."""
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while True:
            task_runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids)))
            )
            if done(task_runs) or time.monotonic() > deadline:
                return task_runs
            await asyncio.sleep(0.25)


def sandbox_stats(base_url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base_url}/sandbox/stats", timeout=10).json())


def read_report(request_id: str) -> dict[str, list[dict[str, str]]]:
    """app_id -> rows of its report file."""
    import csv
    import io

    from campaign_trigger.config import get_settings
    from campaign_trigger.store.files import get_storage

    storage = get_storage(get_settings())
    reports: dict[str, list[dict[str, str]]] = {}
    for key in load_request(request_id).report_paths:
        with storage.open(key, "rb") as handle:
            text = handle.read().decode()
        reports[key.rsplit("/", 1)[1].removesuffix(".csv")] = list(
            csv.DictReader(io.StringIO(text))
        )
    return reports


def add_csv_request(
    tenant: Tenant,
    rows: Sequence[dict[str, str]],
    *,
    send_at: datetime,
    chunk_size: int | None = None,
) -> str:
    """A CSV request as create_request leaves it: the file ingested, the row in the outbox."""
    import csv
    import io

    from campaign_trigger.config import get_settings
    from campaign_trigger.services.uploads import copy_to_storage
    from campaign_trigger.store.files import get_storage

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    key = f"uploads/{uuid.uuid4().hex}.csv"
    written = copy_to_storage(
        io.BytesIO(text.getvalue().encode()),
        storage=get_storage(get_settings()),
        key=key,
        max_bytes=10**10,
    )
    upload = StoredUpload.of(written, filename="batch.csv", content_type="text/csv")
    trigger = TriggerInput(
        campaign_id=tenant.campaign_id, send_at=send_at.isoformat(), upload=upload
    )
    return _create(tenant, trigger, chunk_size=chunk_size)


def plan_of(
    chunk_count: int, *, chunk_size: int = 1, recorded: frozenset[int] = frozenset()
) -> DeliveryPlan:
    """A push request's delivery plan of ``chunk_count`` chunks, ``recorded`` done, for
    tests of the flows that need no request in the database."""
    return DeliveryPlan(
        request_id=f"r-{uuid.uuid4().hex[:6]}",
        campaign_id="c",
        channel=Channel.push,
        title="t",
        body="b",
        send_at=datetime.now(UTC),
        apps=(),
        message_count=chunk_count * chunk_size,
        chunk_size=chunk_size,
        chunk_count=chunk_count,
        recorded=set(recorded),
    )


def sweeps_on_events_only(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """A worker started after this looks for cancelled and dead runs only when the Prefect
    server announces one (its cancel watch and dead-run sweep never look on their own,
    once at their start aside); the event returned is set once its event subscription is
    open."""
    monkeypatch.setattr(upkeep, "FALLBACK_SECONDS", 3600.0)
    monkeypatch.setattr(upkeep, "NO_STREAM_SECONDS", 3600.0)
    subscribed = asyncio.Event()
    subscriber = get_events_subscriber  # what wakeup subscribes with

    @contextlib.asynccontextmanager
    async def noted(**kwargs: Any) -> AsyncIterator[Any]:
        async with subscriber(**kwargs) as events:
            subscribed.set()
            yield events

    monkeypatch.setattr(wakeup, "get_events_subscriber", noted)
    return subscribed


@contextlib.asynccontextmanager
async def worker_once_subscribed(subscribed: asyncio.Event, **options: Any) -> AsyncIterator[None]:
    """An in-process worker (two slots, ``run_worker``'s other ``options``), from the
    moment ``subscribed`` is set (its event subscription open); it stops at the end."""
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(concurrency=2, stop=stop, **options))
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=60)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=60)


@contextlib.asynccontextmanager
async def worker_on_events_only(
    monkeypatch: pytest.MonkeyPatch, *, poll_seconds: float
) -> AsyncIterator[None]:
    """An in-process worker (two slots) whose sweeps look only on events
    (:func:`sweeps_on_events_only`), from the moment its event subscription is open; it
    stops at the end."""
    async with worker_once_subscribed(
        sweeps_on_events_only(monkeypatch), poll_seconds=poll_seconds
    ):
        yield


def run_slots(worker: DeliveryWorker) -> anyio.CapacityLimiter:
    """A worker's run slots (set by the test that made the worker)."""
    assert worker._limiter is not None
    return worker._limiter
