"""Creating a request (a batch): the one create use case, for the API and the flows.

:func:`create_request` checks a trigger call in the spec's order (campaign id, then
campaign, then time, then messages), writes the request's message file, stores the
request and its messages in one transaction (state ``scheduled``, no flow run yet: it
is in the outbox), then wakes the scheduling service, which creates the Prefect flow
run without the caller waiting. Who calls it decides whose organisation acts and
takes the quota unit: the API for the signed-in account's, ``send-batch`` for the
campaign's (:func:`campaign_owner`).

:func:`preview_request` (``?dry_run=true``, ``send-batch`` with ``dry_run``) runs the
very same checks (:func:`_checked`) and stops before storing: it writes its files in a
scratch storage of its own (:mod:`campaign_trigger.services.preview`) and describes
what would be sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import CampaignNotFound, CampaignNotReady, Conflict, InvalidInput
from campaign_trigger.schemas.preview import TriggerPreview
from campaign_trigger.services import app_credentials, lookup, preview, scheduling
from campaign_trigger.services.json_text import as_text
from campaign_trigger.services.message_file import write_messages
from campaign_trigger.services.send_time import resolve_send_at
from campaign_trigger.services.trigger_input import (
    BOTH,
    MISSING,
    NEITHER,
    TriggerInput,
    check_campaign_id,
    check_messages,
)
from campaign_trigger.services.uploads import StoredUpload, sniff_csv, stage_stored_file
from campaign_trigger.store.files import Storage, messages_key, upload_key
from campaign_trigger.store.models import (
    Campaign,
    CampaignState,
    Channel,
    MessageSource,
    Request,
    RequestMessage,
    new_id,
)

log = logging.getLogger(__name__)

IDEMPOTENCY_CONFLICT = (
    "This Idempotency-Key was already used with a different request body; "
    "use a new key for a new request"
)


def unknown_campaign(campaign_id: str) -> CampaignNotFound:
    return CampaignNotFound(f"Unknown campaign with identifier {campaign_id}")


def campaign_owner(*, session: Session, campaign_id: str) -> int:
    """The organisation of a campaign (a flow acts for it); the create refusal if none."""
    campaign = lookup.campaign(session=session, campaign_id=campaign_id)
    if campaign is None:
        raise unknown_campaign(campaign_id)
    return campaign.org_id


def ready_campaign(*, session: Session, org_id: int, campaign_id: str) -> Campaign:
    """The organisation's campaign, if started; another organisation's is unknown."""
    campaign = lookup.org_campaign(session=session, org_id=org_id, campaign_id=campaign_id)
    if campaign is None:
        raise unknown_campaign(campaign_id)
    if campaign.state != CampaignState.started:
        raise CampaignNotReady(f"Campaign with identifier {campaign_id} is not ready")
    return campaign


def replayed(*, session: Session, org_id: int, key: str, digest: str | None) -> str | None:
    """The id of the request made earlier with this key, or None; Conflict if bodies differ."""
    earlier = session.exec(
        select(Request).where(Request.org_id == org_id, Request.idempotency_key == key)
    ).first()
    if earlier is None:
        return None
    if earlier.body_hash != digest:
        raise Conflict(IDEMPOTENCY_CONFLICT)
    return earlier.id


def create_request(
    *,
    session: Session,
    settings: Settings,
    storage: Storage,
    org_id: int,
    request_id: str,
    trigger: TriggerInput,
    now: datetime | None = None,
) -> str:
    """Check and store a trigger call; returns the request id (the earlier one on replay).

    Commits the request before it returns (the outbox drainer is woken after). Blocking
    (database, file checks): call it from a worker thread. The upload, if any, is
    deleted unless it becomes the request's file.
    """
    uploads: list[StoredUpload] = [trigger.upload] if trigger.upload is not None else []
    created = None
    try:
        created = _create(
            session=session,
            settings=settings,
            storage=storage,
            org_id=org_id,
            request_id=request_id,
            trigger=trigger,
            uploads=uploads,
            now=now or datetime.now(UTC),
        )
    finally:
        for upload in uploads:
            if created != request_id:
                storage.delete(upload.key)
    if created == request_id:
        scheduling.notify_new_request(request_id)
    return created


def preview_request(
    *,
    session: Session,
    settings: Settings,
    storage: Storage,
    scratch: Storage,
    org_id: int,
    trigger: TriggerInput,
    now: datetime | None = None,
) -> TriggerPreview:
    """Check a trigger call exactly as :func:`create_request` does and describe what it
    would send; nothing is stored, scheduled or sent.

    Whatever the checks write (send-batch's staged file, the message file) goes to
    ``scratch``, which the caller discards (:func:`preview.scratch_storage`); an upload
    to preview must have been streamed there too. The idempotency key plays no part:
    a preview is never replayed. Blocking: call it from a worker thread.
    """
    checked = _checked(
        session=session,
        settings=settings,
        storage=storage,
        files=scratch,
        org_id=org_id,
        request_id=new_id(),
        trigger=trigger,
        uploads=[],
        now=now or datetime.now(UTC),
    )
    return preview.describe(
        session=session,
        files=scratch,
        request=checked.request,
        campaign=checked.campaign,
    )


def _file(
    trigger: TriggerInput, *, storage: Storage, target: Storage, request_id: str, max_bytes: int
) -> StoredUpload | None:
    """The CSV file of the call: the API's upload, or send-batch's file copied now."""
    if trigger.source_key is None:
        return trigger.upload
    return stage_stored_file(
        storage=storage,
        source_key=trigger.source_key,
        target=target,
        key=upload_key(request_id),
        max_bytes=max_bytes,
    )


@dataclass
class _Checked:
    """A trigger call that passed every check: the request to store, its JSON messages
    and the campaign; its message file is written under ``messages_key(request.id)``."""

    request: Request
    messages: list[dict[str, Any]]
    campaign: Campaign
    upload: StoredUpload | None


def _create(
    *,
    session: Session,
    settings: Settings,
    storage: Storage,
    org_id: int,
    request_id: str,
    trigger: TriggerInput,
    uploads: list[StoredUpload],
    now: datetime,
) -> str:
    key = trigger.idempotency_key
    if key:  # an empty key is no key: stored, it would replay its request for any body
        earlier = replayed(session=session, org_id=org_id, key=key, digest=trigger.body_hash)
        if earlier is not None:
            return earlier
    checked = _checked(
        session=session,
        settings=settings,
        storage=storage,
        files=storage,
        org_id=org_id,
        request_id=request_id,
        trigger=trigger,
        uploads=uploads,
        now=now,
    )
    request, messages = checked.request, checked.messages
    file_key = messages_key(request_id)
    try:
        _store(session, request, messages)
    except IntegrityError:
        session.rollback()
        storage.delete(file_key)
        if not key:
            raise
        earlier = replayed(session=session, org_id=org_id, key=key, digest=trigger.body_hash)
        if earlier is None:  # the same key, created concurrently, is the only conflict
            raise
        return earlier
    except BaseException:
        session.rollback()
        storage.delete(file_key)
        raise
    log.info(
        "request %s accepted: %d messages for campaign %s",
        request_id,
        request.message_count,
        request.campaign_id,
    )
    return request_id


def _checked(
    *,
    session: Session,
    settings: Settings,
    storage: Storage,
    files: Storage,
    org_id: int,
    request_id: str,
    trigger: TriggerInput,
    uploads: list[StoredUpload],
    now: datetime,
) -> _Checked:
    """Every check of a create, in the spec's order; writes the message file to ``files``.

    ``storage`` holds send-batch's source file; ``files`` receives what the checks write
    (the staged copy of that file, the message file): the storage itself for a create,
    a scratch storage for a preview. A staged copy is appended to ``uploads``.
    """
    campaign_id = check_campaign_id(trigger.campaign_id)
    campaign = ready_campaign(session=session, org_id=org_id, campaign_id=campaign_id)
    if campaign.channel == Channel.push:
        app_credentials.check_sendable(session=session, settings=settings, campaign_id=campaign_id)
    session.commit()  # hold no transaction open while a large file is checked
    variables = list(campaign.variables)
    send_at = resolve_send_at(trigger.send_at, now=now)

    # The spec's texts exactly: a form's file under another key than `file` is no file,
    # a JSON body's `file` member is no file either (it only makes messages "both").
    has_json = trigger.messages is not MISSING and trigger.messages is not None
    has_file = trigger.upload is not None or trigger.source_key is not None
    if not has_json and not has_file:
        raise InvalidInput(NEITHER)
    if (has_json and (has_file or trigger.file_member)) or trigger.extra_files:
        raise InvalidInput(BOTH)

    messages: list[dict[str, Any]] = []
    upload = _file(
        trigger,
        storage=storage,
        target=files,
        request_id=request_id,
        max_bytes=settings.max_upload_bytes,
    )
    if upload is not None and upload is not trigger.upload:
        uploads.append(upload)
    file_key = messages_key(request_id)
    if upload is not None:
        # Imported here: pandas and pandera are a quarter of a worker process's start
        # (3 of 12 s of CPU on a slow machine), and the worker ingests a file only for a
        # send-batch run; the API loads them as it starts (``api/app.py``).
        from campaign_trigger.services.ingest import ingest_message_file

        sniff_csv(upload.head, filename=upload.filename, content_type=upload.content_type)
        count = ingest_message_file(
            storage=files,
            upload_key=upload.key,
            facts=upload.facts,
            messages_key=file_key,
            variables=variables,
            chunk_size=settings.chunk_size,
        )
    else:
        messages = check_messages(
            trigger.messages, variables=variables, cap=settings.json_messages_cap
        )
        count = write_messages(
            storage=files,
            key=file_key,
            users=[m["user_id"] for m in messages],
            values={
                name: [as_text(m["template_variables"].get(name)) for m in messages]
                for name in variables
            },
            chunk_size=settings.chunk_size,
        )
    key = trigger.idempotency_key or None
    request = Request(
        id=request_id,
        org_id=org_id,
        campaign_id=campaign_id,
        requested_at=now,
        send_at=send_at,
        source=MessageSource.csv if upload else MessageSource.json,
        message_count=count,
        chunk_size=settings.chunk_size,
        messages_path=upload.key if upload else None,
        idempotency_key=key,
        body_hash=trigger.body_hash if key else None,
    )
    return _Checked(request=request, messages=messages, campaign=campaign, upload=upload)


def _store(session: Session, request: Request, messages: list[dict[str, Any]]) -> None:
    """The request and its JSON messages, committed together.

    Core inserts on the session's connection: nothing reads the request back through
    this session, and the ORM's unit of work cost more than the statements."""
    connection = session.connection()
    connection.execute(insert(Request.__table__), [request.model_dump()])  # type: ignore[attr-defined]
    if messages:
        connection.execute(
            insert(RequestMessage.__table__),  # type: ignore[attr-defined]
            [
                {
                    "request_id": request.id,
                    "seq": seq,
                    "user_id": m["user_id"],
                    "template_variables": m["template_variables"],
                }
                for seq, m in enumerate(messages)
            ],
        )
    session.commit()
