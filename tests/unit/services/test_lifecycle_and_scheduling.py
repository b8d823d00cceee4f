"""Cancel, the scheduled list, the outbox and the state mirror on a real SQLite session,
with a recording fake of the Prefect client where the outbox needs one."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prefect.client.schemas.objects import State, StateType
from prefect.settings import PREFECT_API_URL, temporary_settings
from sqlmodel import Session

from campaign_trigger.config import Settings
from campaign_trigger.errors import RequestNotFound, RequestStateError
from campaign_trigger.services import lifecycle, scheduling
from campaign_trigger.services.prefect_runs import DEAD_RUN_STATE_NAME
from campaign_trigger.services.request_states import mirror_of, set_state
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.files import Storage
from campaign_trigger.store.models import Request, RequestState
from service_support import Org, make_org
from support import free_port


def _request(
    session: Session, settings: Settings, storage: Storage, org: Org, *, hours: float = 1
) -> str:
    send_at = datetime.now(UTC) + timedelta(hours=hours)
    return create_request(
        session=session,
        settings=settings,
        storage=storage,
        org_id=org.org_id,
        request_id=uuid.uuid4().hex,
        trigger=TriggerInput(
            campaign_id=org.campaign_id,
            send_at=send_at.isoformat(),
            messages=[{"user_id": "u", "template_variables": {"first_name": "a", "code": "b"}}],
        ),
    )


def test_one_mapping_from_run_states_to_request_states() -> None:
    def mirror(kind: StateType, has_reports: bool = False, name: str | None = None) -> object:
        return mirror_of(State(type=kind, name=name), has_reports=has_reports)

    assert mirror(StateType.SCHEDULED) == RequestState.scheduled
    assert mirror(StateType.RUNNING) == RequestState.running
    assert mirror(StateType.CANCELLING) == RequestState.canceled
    assert mirror(StateType.CRASHED) == RequestState.failed
    # marked dead: taken over by a live worker
    assert mirror(StateType.CRASHED, name=DEAD_RUN_STATE_NAME) == RequestState.running
    assert mirror(StateType.COMPLETED, has_reports=True) == RequestState.processed
    assert mirror(StateType.COMPLETED) is None  # the flow writes it
    assert mirror_of(None, has_reports=True) is None


def test_a_checked_write_never_overwrites_a_newer_state(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    request_id = _request(session, settings, storage, org)
    assert set_state(session=session, request_id=request_id, state=RequestState.running)
    assert not set_state(
        session=session,
        request_id=request_id,
        state=RequestState.failed,
        only_from=[RequestState.scheduled],
    )
    session.commit()
    request = session.get(Request, request_id)
    assert request is not None
    assert request.state == RequestState.running


def test_a_request_in_the_outbox_is_cancelled_in_the_database_alone(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    request_id = _request(session, settings, storage, org)
    cancelled = asyncio.run(
        lifecycle.cancel_request(session=session, org_id=org.org_id, request_id=request_id)
    )
    assert cancelled.state == RequestState.canceled
    with pytest.raises(RequestStateError) as caught:
        asyncio.run(
            lifecycle.cancel_request(session=session, org_id=org.org_id, request_id=request_id)
        )
    assert caught.value.message == "Request already canceled"
    assert scheduling._outbox_batch(session, 10) == []  # never scheduled


def test_another_organisations_request_is_unknown(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    request_id = _request(session, settings, storage, org)
    other = make_org(session)
    for org_id, wanted in ((other.org_id, request_id), (org.org_id, "\x00bad")):
        with pytest.raises(RequestNotFound):
            asyncio.run(lifecycle.cancel_request(session=session, org_id=org_id, request_id=wanted))


def test_the_scheduled_list_falls_back_to_the_mirror_without_prefect(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    first = _request(session, settings, storage, org, hours=2)
    second = _request(session, settings, storage, org, hours=1)
    port = free_port()  # nobody listens there
    session.get(Request, first).flow_run_id = str(uuid.uuid4())  # type: ignore[union-attr]
    session.commit()
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        listed, total = asyncio.run(
            lifecycle.scheduled_requests(
                session=session, org_id=org.org_id, campaign_id=org.campaign_id, limit=10, offset=0
            )
        )
        following, following_total = asyncio.run(
            lifecycle.scheduled_requests(
                session=session,
                org_id=org.org_id,
                campaign_id=org.campaign_id,
                limit=10,
                offset=0,
                after=second,
            )
        )
    assert total == 2
    assert [r.id for r in listed] == [second, first]  # soonest first
    assert ([r.id for r in following], following_total) == ([first], 2)


class FakePrefect:
    """The two calls the outbox drainer makes; records the runs it was asked to create."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def read_deployment_by_name(self, name: str) -> Any:
        return type("Deployment", (), {"id": uuid.uuid4()})()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.bodies.extend(kwargs["json"])
        results = [{"status": "CREATED", "flow_run_id": str(uuid.uuid4())} for _ in kwargs["json"]]
        return type("Answer", (), {"json": lambda self: {"results": results}})()


def test_the_outbox_drains_in_send_order_once(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    later = _request(session, settings, storage, org, hours=3)
    sooner = _request(session, settings, storage, org, hours=1)
    fake = FakePrefect()
    created = asyncio.run(scheduling.drain_outbox(session=session, client=fake))  # type: ignore[arg-type]
    assert created == 2
    assert [body["name"] for body in fake.bodies] == [sooner, later]
    assert all(body["idempotency_key"] == body["name"] for body in fake.bodies)
    assert all(session.get(Request, r).flow_run_id for r in (sooner, later))  # type: ignore[union-attr]
    again = asyncio.run(scheduling.drain_outbox(session=session, client=fake))  # type: ignore[arg-type]
    assert again == 0
