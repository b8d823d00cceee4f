"""Delivering a chunk on a real SQLite session with a recording fake provider: what is
sent, what is recorded, what a re-run skips, and what answers teach about devices."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import PushMessage, PushProvider, PushResult
from campaign_trigger.delivery.credentials import fcm_credentials
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.delivery.providers import ProviderFor
from campaign_trigger.services import delivery_run, outcome_log
from campaign_trigger.services.audience import AppTarget
from campaign_trigger.services.delivering import SendsInterrupted, process_chunk
from campaign_trigger.services.message_file import USER_FIELD
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.files import Storage
from campaign_trigger.store.models import (
    App,
    Channel,
    Device,
    Outcome,
    Platform,
    Request,
    RequestState,
)
from service_support import Org
from support import free_port


class FakeProvider:
    """Records what it was asked to send; answers by token prefix (like the sandbox)."""

    platform = Platform.android
    endpoint = "http://fake-provider.test"

    def __init__(self, *, refuse_credentials: bool = False) -> None:
        self.sent: list[PushMessage] = []
        self.auth_failed = False
        self._refuse = refuse_credentials
        self.calls: list[tuple[str, datetime]] = []  # prepare, send_many: when

    async def prepare(self) -> None:
        self.calls.append(("prepare", datetime.now(UTC)))

    async def send_many(
        self, messages: Sequence[PushMessage], *, on_result: Any = None
    ) -> list[PushResult]:
        self.calls.append(("send_many", datetime.now(UTC)))
        results = []
        for message in messages:
            if self._refuse:
                self.auth_failed = True
                result = PushResult(message.key, "FPErrPushFailed", None, None)
            elif message.token.startswith("unregistered-"):
                result = PushResult(message.key, "FPErrTokenUnregistered", None, datetime.now(UTC))
            else:
                self.sent.append(message)
                result = PushResult(message.key, "", datetime.now(UTC), None)
            if on_result is not None:
                await on_result(result)
            results.append(result)
        return results

    async def aclose(self) -> None:
        return None


class SlowToPrepare(FakeProvider):
    """A provider whose token endpoint or connection takes a minute."""

    async def prepare(self) -> None:
        await super().prepare()
        await asyncio.sleep(60)


def _devices(session: Session, org: Org, tokens: dict[str, str]) -> None:
    session.execute(
        insert(Device),
        [
            {
                "app_id": org.app_id,
                "device_id": f"d-{user}",
                "user_id": user,
                "push_token": token,
                "opted_in": True,
                "logged_in": True,
                "updated_at": datetime.now(UTC),
            }
            for user, token in tokens.items()
        ],
    )
    session.commit()


def _request(
    session: Session,
    settings: Settings,
    storage: Storage,
    org: Org,
    n: int,
    send_at: datetime | None = None,
) -> str:
    messages = [
        {"user_id": f"u{i}", "template_variables": {"first_name": f"N{i}", "code": f"C{i}"}}
        for i in range(n)
    ]
    return create_request(
        session=session,
        settings=settings,
        storage=storage,
        org_id=org.org_id,
        request_id=f"r{n}-{org.org_id}",
        trigger=TriggerInput(
            campaign_id=org.campaign_id,
            messages=messages,
            send_at=send_at.isoformat() if send_at else None,
        ),
    )


def _chunk(users: list[str]) -> pa.Table:
    return pa.table(
        {
            USER_FIELD: users,
            "first_name": [f"N{u[1:]}" for u in users],
            "code": [f"C{u[1:]}" for u in users],
        }
    )


def _deliver(
    session: Session, settings: Settings, request_id: str, chunk: pa.Table, provider: PushProvider
) -> Any:
    plan = delivery_run.start_delivery(session=session, settings=settings, request_id=request_id)
    provider_for: ProviderFor = lambda _settings, _app, _credentials: provider  # noqa: E731
    return asyncio.run(
        process_chunk(
            session=session,
            settings=settings,
            job=plan.job(0),
            chunk=chunk,
            provider_for=provider_for,
        )
    )


def _deliver_ahead(
    session: Session, settings: Settings, storage: Storage, org: Org, provider: FakeProvider
) -> tuple[datetime, datetime, datetime]:
    """Deliver a one-message request due in two seconds (time enough, on a loaded machine,
    to make the request and reach its chunk before then): its send time, when
    ``provider`` was prepared, when it sent."""
    _devices(session, org, {"u0": "t0"})
    send_at = datetime.now(UTC) + timedelta(seconds=2)
    request_id = _request(session, settings, storage, org, 1, send_at=send_at)
    _deliver(session, settings, request_id, _chunk(["u0"]), provider)
    [(first, prepared), (then, sent)] = provider.calls
    assert (first, then) == ("prepare", "send_many")
    return send_at, prepared, sent


def _outcomes(session: Session, request_id: str) -> dict[str, str]:
    rows = session.exec(select(Outcome).where(col(Outcome.request_id) == request_id)).all()
    return {row.user_id: row.error_message for row in rows}


def test_a_chunk_is_rendered_sent_and_recorded_with_collapse_ids(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    _devices(session, org, {"u0": "t0", "u1": "t1"})
    request_id = _request(session, settings, storage, org, 3)
    provider = FakeProvider()
    result = _deliver(session, settings, request_id, _chunk(["u0", "u1", "u2"]), provider)
    assert [(m.token, m.title, m.body) for m in provider.sent] == [
        ("t0", "Hi N0", "Code C0"),
        ("t1", "Hi N1", "Code C1"),
    ]
    assert len({m.collapse_id for m in provider.sent}) == 2
    assert _outcomes(session, request_id) == {"u0": "", "u1": "", "u2": "No device for user"}
    assert result.outcomes == {"": 2, "No device for user": 1}
    assert outcome_log.recorded_chunks(session=session, request_id=request_id) == {0}


def test_a_rerun_sends_only_what_was_not_recorded(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    _devices(session, org, {"u0": "t0", "u1": "t1", "u2": "t2"})
    request_id = _request(session, settings, storage, org, 3)
    session.add(  # an interrupted run recorded u1's answer, then died
        Outcome(
            request_id=request_id,
            row_no=1,
            app_id=org.app_id,
            user_id="u1",
            device_id="d-u1",
            channel=Channel.push,
            error_message="",
        )
    )
    session.commit()
    provider = FakeProvider()
    result = _deliver(session, settings, request_id, _chunk(["u0", "u1", "u2"]), provider)
    assert [m.token for m in provider.sent] == ["t0", "t2"]
    assert result.resumed == 1
    again = FakeProvider()
    assert _deliver(session, settings, request_id, _chunk(["u0", "u1", "u2"]), again).skipped
    assert again.sent == []


def test_a_chunk_cancelled_while_its_answers_are_written_ends_after_their_transaction(
    database: str,
    session: Session,
    settings: Settings,
    storage: Storage,
    org: Org,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worst moment for a cancel (the UI's *Cancel* stopping a running request): a
    batch of the chunk's answers written in the recorder's thread, not yet committed.
    The chunk's coroutine must not end before that thread is done with its session: its
    caller's rollback and close (``session_scope``) would otherwise run beside the
    thread's commit, and a transaction the session no longer knows could stay open on a
    pooled connection (on SQLite, the one write lock: every other writer of the service
    "database is locked", as a CI run of the UI-cancel test once showed)."""
    _devices(session, org, {"u0": "t0", "u1": "t1"})
    request_id = _request(session, settings, storage, org, 2)
    plan = delivery_run.start_delivery(session=session, settings=settings, request_id=request_id)
    written, release = threading.Event(), threading.Event()
    ended: dict[str, float] = {}
    real_commit = outcome_log._commit

    def held_before_its_commit(own: Session, rows: Any, **kwargs: Any) -> None:
        if rows:  # the answers' batch, written: held before its commit
            outcome_log._insert_outcomes(own, rows)
            written.set()
            release.wait(10)
        try:
            real_commit(own, rows, **kwargs)
        finally:
            ended["thread"] = time.monotonic()

    monkeypatch.setattr(outcome_log, "_commit", held_before_its_commit)
    provider = FakeProvider()

    async def chunk() -> None:
        with Session(engine_for(database), expire_on_commit=False) as own:  # deliver_chunk's
            try:
                await process_chunk(
                    session=own,
                    settings=settings,
                    job=plan.job(0),
                    chunk=_chunk(["u0", "u1"]),
                    provider_for=lambda _settings, _app, _credentials: provider,
                )
            except BaseException:
                ended["chunk"] = time.monotonic()
                own.rollback()
                raise

    async def cancel_mid_write() -> None:
        task = asyncio.create_task(chunk())
        assert await asyncio.to_thread(written.wait, 10)
        task.cancel()
        threading.Timer(0.3, release.set).start()  # the thread goes on as the cancel unwinds
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_write())
    assert ended["thread"] <= ended["chunk"]
    probe = sqlite3.connect(engine_for(database).url.database or "", timeout=1)
    try:  # no transaction left open: another writer gets the write lock at once
        probe.execute("BEGIN IMMEDIATE")
        probe.rollback()
    finally:
        probe.close()
    assert [m.token for m in provider.sent] == ["t0"]  # the cancel came before u1's send
    assert _outcomes(session, request_id) == {"u0": ""}  # its answer committed


def test_an_unregistered_token_is_marked_on_its_device_with_its_answer(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    _devices(session, org, {"u0": "unregistered-0", "u1": "t1"})
    request_id = _request(session, settings, storage, org, 2)
    _deliver(session, settings, request_id, _chunk(["u0", "u1"]), FakeProvider())
    devices = {d.user_id: d for d in session.exec(select(Device)).all()}
    assert devices["u0"].unregistered_at is not None
    assert devices["u1"].unregistered_at is None
    assert _outcomes(session, request_id)["u0"] == "FPErrTokenUnregistered"


def test_refused_credentials_flag_the_app(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    _devices(session, org, {"u0": "t0"})
    request_id = _request(session, settings, storage, org, 1)
    _deliver(session, settings, request_id, _chunk(["u0"]), FakeProvider(refuse_credentials=True))
    app = session.exec(select(App).where(App.app_id == org.app_id)).one()
    assert app.provider_auth_failed_at is not None
    assert _outcomes(session, request_id) == {"u0": "FPErrPushFailed"}


def test_an_unreachable_provider_is_logged_with_its_url_and_the_error(
    session: Session,
    settings: Settings,
    storage: Storage,
    org: Org,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _devices(session, org, {"u0": "t0", "u1": "t1"})
    request_id = _request(session, settings, storage, org, 2)
    nobody = f"http://127.0.0.1:{free_port()}"  # a sandbox that was never started
    unreachable = settings.model_copy(
        update={"fcm_base_url": nobody, "fcm_token_uri": f"{nobody}/token"}
    )
    provider = FcmProvider(fcm_credentials(unreachable), max_attempts=2, backoff_base=0.01)
    with caplog.at_level(logging.WARNING, logger="campaign_trigger.services.delivering"):
        _deliver(session, settings, request_id, _chunk(["u0", "u1"]), provider)
    asyncio.run(provider.aclose())
    assert _outcomes(session, request_id) == {"u0": "FPErrPushFailed", "u1": "FPErrPushFailed"}
    [line] = [r.getMessage() for r in caplog.records if "pushes failed" in r.getMessage()]
    assert f"request {request_id} chunk 0 app {org.app_id}: 2 of 2 pushes failed" in line
    assert f"FCM {nobody}" in line
    assert f"token endpoint {nobody}/token unreachable: ConnectError" in line
    assert "(after 2 tries) (2)" in line


def test_the_provider_readies_its_first_send_before_the_send_time_and_sends_at_it(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    """A token and a connection made after the bell made the first send of a chunk late
    by their round trips (a worker's first request to an app, or after a token expired)."""
    send_at, prepared, sent = _deliver_ahead(session, settings, storage, org, FakeProvider())
    assert prepared < send_at <= sent


def test_a_slow_preparation_is_cut_at_the_send_time(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    provider = SlowToPrepare()
    send_at, _, sent = _deliver_ahead(session, settings, storage, org, provider)
    assert provider.sent
    assert (sent - send_at).total_seconds() < 10  # not after the 60 s of its preparation


def test_a_chunk_already_due_sends_without_preparing(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    _devices(session, org, {"u0": "t0"})
    request_id = _request(session, settings, storage, org, 1)  # now
    provider = FakeProvider()
    _deliver(session, settings, request_id, _chunk(["u0"]), provider)
    assert [call for call, _ in provider.calls] == ["send_many"]


def test_the_apps_of_a_campaign_are_its_targets(session: Session, org: Org) -> None:
    from campaign_trigger.services.audience import campaign_apps

    assert campaign_apps(session=session, campaign_id=org.campaign_id) == [
        AppTarget(app_id=org.app_id, platform=Platform.android)
    ]


class BrokenOffByTheDatabase(FakeProvider):
    """Its sends break off on an answer the database could not record, in an error whose
    text quotes the row (as PostgreSQL's detail does)."""

    async def send_many(
        self, messages: Sequence[PushMessage], *, on_result: Any = None
    ) -> list[PushResult]:
        row = ", ".join(f"{m.token}, {m.body}" for m in messages)
        raise IntegrityError(
            "INSERT INTO inbox_message (push_token, body) VALUES (?, ?)",
            None,
            Exception(f"not-null constraint\nDETAIL:  Failing row contains ({row})."),
        )


def test_sends_broken_off_are_told_without_the_text_of_their_error(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    """The message of ``SendsInterrupted`` is the Failed state the Prefect UI shows."""
    _devices(session, org, {"u0": "t0"})
    request_id = _request(session, settings, storage, org, 1)
    with pytest.raises(SendsInterrupted) as raised:
        _deliver(session, settings, request_id, _chunk(["u0"]), BrokenOffByTheDatabase())
    told = str(raised.value)
    assert "Code C0" not in told
    assert "t0" not in told
    assert "broke off (IntegrityError)" in told


def test_a_run_claiming_a_request_records_itself_where_the_outbox_could_not(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    # The drain created the run, then could not write its id (killed, or the database
    # locked); the run claimed the request before another drain, which skips a request no
    # longer scheduled: its id was never recorded, and the request's report and cancel
    # answered "not processed yet" and "can't be canceled" for good.
    request_id = _request(session, settings, storage, org, 1)
    plan = delivery_run.start_delivery(
        session=session, settings=settings, request_id=request_id, run_id="run-a"
    )
    assert not plan.canceled
    request = session.get(Request, request_id)
    assert request is not None
    session.refresh(request)
    assert (request.state, request.flow_run_id) == (RequestState.running, "run-a")


@pytest.mark.parametrize("state", [RequestState.scheduled, RequestState.processed])
def test_a_second_run_of_a_request_that_has_its_own_sends_nothing(
    session: Session, settings: Settings, storage: Storage, org: Org, state: RequestState
) -> None:
    # A "Custom run" of deliver-request started in the UI for a request whose own run is
    # scheduled (or done): both claimed it, and each sent every message.
    request_id = _request(session, settings, storage, org, 1)
    request = session.get(Request, request_id)
    assert request is not None
    request.flow_run_id, request.state = "run-a", state
    session.add(request)
    session.commit()
    plan = delivery_run.start_delivery(
        session=session, settings=settings, request_id=request_id, run_id="run-b"
    )
    assert (plan.canceled, plan.delivered_by) == (True, "run-a")
    session.refresh(request)
    assert (request.state, request.flow_run_id) == (state, "run-a")
    own = delivery_run.start_delivery(
        session=session, settings=settings, request_id=request_id, run_id="run-a"
    )
    assert (own.canceled, own.delivered_by) == (False, None)
