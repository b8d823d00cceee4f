"""The create use case on a real SQLite session: checks in the spec's order, what is
stored, idempotency, the send-batch file path, and nothing left behind when refused."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import CampaignNotFound, CampaignNotReady, Conflict, InvalidInput
from campaign_trigger.services import json_text
from campaign_trigger.services.message_file import USER_FIELD, read_chunk
from campaign_trigger.services.requests import campaign_owner, create_request
from campaign_trigger.services.trigger_input import TriggerInput, body_hash
from campaign_trigger.services.uploads import StoredUpload, copy_to_storage
from campaign_trigger.store.files import Storage, messages_key, upload_key
from campaign_trigger.store.models import CampaignState, MessageSource, Request, RequestMessage
from service_support import Org, make_org

MESSAGES = [
    {"user_id": "u1", "template_variables": {"first_name": "Ada", "code": "007"}},
    {"user_id": "u2", "template_variables": {"first_name": "Alan", "code": 2}},
]


def _create(
    session: Session, settings: Settings, storage: Storage, org_id: int, trigger: TriggerInput
) -> str:
    return create_request(
        session=session,
        settings=settings,
        storage=storage,
        org_id=org_id,
        request_id="r-" + datetime.now(UTC).strftime("%H%M%S%f"),
        trigger=trigger,
    )


def test_json_messages_are_stored_in_the_outbox_with_their_message_file(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    trigger = TriggerInput(campaign_id=org.campaign_id, messages=MESSAGES)
    request_id = _create(session, settings, storage, org.org_id, trigger)
    request = session.get(Request, request_id)
    assert request is not None
    assert (request.source, request.message_count, request.flow_run_id) == (
        MessageSource.json,
        2,
        None,
    )
    assert request.chunk_size == 3
    rows = session.exec(select(RequestMessage).order_by(col(RequestMessage.seq))).all()
    assert [r.user_id for r in rows] == ["u1", "u2"]
    chunk = read_chunk(storage=storage, key=messages_key(request_id), chunk_no=0)
    assert chunk.to_pylist() == [
        {USER_FIELD: "u1", "first_name": "Ada", "code": "007"},
        {USER_FIELD: "u2", "first_name": "Alan", "code": "2"},
    ]


def test_checks_come_in_the_specs_order(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    draft = make_org(session, state=CampaignState.draft)
    cases: list[tuple[TriggerInput, int, type[Exception], str]] = [
        (TriggerInput(), org.org_id, InvalidInput, "You must provide a campaign identifier"),
        (
            TriggerInput(campaign_id="nope", send_at="garbage"),
            org.org_id,
            CampaignNotFound,
            "Unknown campaign with identifier nope",
        ),
        (  # another organisation's campaign is unknown
            TriggerInput(campaign_id=draft.campaign_id),
            org.org_id,
            CampaignNotFound,
            f"Unknown campaign with identifier {draft.campaign_id}",
        ),
        (
            TriggerInput(campaign_id=draft.campaign_id, send_at="garbage"),
            draft.org_id,
            CampaignNotReady,
            f"Campaign with identifier {draft.campaign_id} is not ready",
        ),
        (
            TriggerInput(campaign_id=org.campaign_id, send_at="garbage", messages=[]),
            org.org_id,
            InvalidInput,
            "Invalid time format",
        ),
        (
            TriggerInput(campaign_id=org.campaign_id),
            org.org_id,
            InvalidInput,
            "Must provide JSON messages or a CSV file",
        ),
        (
            TriggerInput(campaign_id=org.campaign_id, messages=MESSAGES, source_key="in/x.csv"),
            org.org_id,
            InvalidInput,
            "Must provide either JSON messages or a CSV file",
        ),
        (
            TriggerInput(campaign_id=org.campaign_id, messages=[{"user_id": "u"}]),
            org.org_id,
            InvalidInput,
            "Invalid file : missing variables : (first_name, code)",
        ),
    ]
    for trigger, org_id, kind, message in cases:
        with pytest.raises(kind) as caught:
            _create(session, settings, storage, org_id, trigger)
        assert caught.value.message == message  # type: ignore[attr-defined]
    assert session.exec(select(Request)).all() == []
    assert not storage.exists("messages") or storage.fs.ls(storage.path("messages")) == []


def test_the_same_idempotency_key_returns_the_first_request_or_conflicts(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    first = TriggerInput(
        campaign_id=org.campaign_id, messages=MESSAGES, idempotency_key="k", body_hash="h1"
    )
    request_id = _create(session, settings, storage, org.org_id, first)
    assert _create(session, settings, storage, org.org_id, first) == request_id
    other = TriggerInput(
        campaign_id=org.campaign_id, messages=MESSAGES, idempotency_key="k", body_hash="h2"
    )
    with pytest.raises(Conflict):
        _create(session, settings, storage, org.org_id, other)
    assert len(session.exec(select(Request)).all()) == 1


def test_an_empty_idempotency_key_is_no_key(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    """Stored with its key, a request made with "" would be every later one's replay."""
    requests = [
        _create(
            session,
            settings,
            storage,
            org.org_id,
            TriggerInput(campaign_id=org.campaign_id, messages=messages, idempotency_key=""),
        )
        for messages in (MESSAGES[:1], MESSAGES)
    ]
    assert requests[0] != requests[1]
    stored = [session.get(Request, request_id) for request_id in requests]
    assert [(r.message_count, r.idempotency_key) for r in stored if r] == [(1, None), (2, None)]


def test_a_csv_in_storage_is_copied_and_ingested_for_send_batch(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    copy_to_storage(
        io.BytesIO(b"User,first_name,code\nu1,Ada,007\nu2,Alan,NA\n"),
        storage=storage,
        key="incoming/today.csv",
        max_bytes=10**6,
    )
    trigger = TriggerInput(campaign_id=org.campaign_id, source_key="incoming/today.csv")
    request_id = _create(session, settings, storage, org.org_id, trigger)
    request = session.get(Request, request_id)
    assert request is not None
    assert request.messages_path == upload_key(request_id)
    assert storage.exists("incoming/today.csv")  # the source is left as it was
    chunk = read_chunk(storage=storage, key=messages_key(request_id), chunk_no=0)
    assert [r["code"] for r in chunk.to_pylist()] == ["007", "NA"]


def test_a_refused_upload_leaves_no_file(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    writer = copy_to_storage(
        io.BytesIO(b"User,first_name\nu1,Ada\n"),
        storage=storage,
        key="uploads/refused.csv",
        max_bytes=10**6,
    )
    upload = StoredUpload.of(writer, filename="x.csv", content_type="text/csv")
    with pytest.raises(InvalidInput):
        _create(
            session,
            settings,
            storage,
            org.org_id,
            TriggerInput(campaign_id=org.campaign_id, upload=upload),
        )
    assert not storage.exists("uploads/refused.csv")


def test_a_flow_acts_for_the_campaigns_organisation(session: Session, org: Org) -> None:
    assert campaign_owner(session=session, campaign_id=org.campaign_id) == org.org_id
    with pytest.raises(CampaignNotFound) as caught:
        campaign_owner(session=session, campaign_id="x" * 65)
    assert caught.value.message == f"Unknown campaign with identifier {'x' * 65}"


def test_send_at_in_the_future_is_kept(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    trigger = TriggerInput(
        campaign_id=org.campaign_id, send_at=later.isoformat(), messages=MESSAGES
    )
    request = session.get(Request, _create(session, settings, storage, org.org_id, trigger))
    assert request is not None
    assert request.send_at == later


def test_a_body_hash_tells_numbers_apart_as_they_were_written() -> None:
    # 2.00 and 2.0 (and -0 and 0) are delivered as written: under one Idempotency-Key the
    # second body replayed the first request, whose messages say otherwise, not a 409.
    bodies = ['{"v": 2.00, "w": -0}', '{"v": 2.0, "w": -0}', '{"v": 2.00, "w": 0}']
    assert len({body_hash(json_text.loads(body)) for body in bodies}) == 3
    # a number written as json writes it back hashes as it did before
    plain = json_text.loads('{"w": 7, "v": 2.5}')
    assert body_hash(plain) == hashlib.sha256(b'{"v":2.5,"w":7}').hexdigest()
