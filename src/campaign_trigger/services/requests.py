"""Creating a request (a batch), and the request as the API shows it.

:func:`create_request` checks a trigger call in the spec's order (campaign id, then
campaign, then time, then messages), stores the request and its messages in one
transaction (state ``scheduled``, no flow run yet: it is in the outbox), then wakes
the scheduling service, which creates the Prefect flow run without the caller waiting.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import (
    CampaignNotFound,
    CampaignNotReady,
    Conflict,
    InvalidInput,
)
from campaign_trigger.services import scheduling
from campaign_trigger.services.ingest import (
    missing_variables_error,
    sniff_csv,
    validate_message_file,
)
from campaign_trigger.services.send_time import resolve_send_at
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import Storage
from campaign_trigger.store.models import (
    Campaign,
    CampaignState,
    MessageSource,
    Request,
    RequestMessage,
)

log = logging.getLogger(__name__)

NO_CAMPAIGN_ID = "You must provide a campaign identifier"
EMPTY_CAMPAIGN_ID = "Empty campaign identifier"
CAMPAIGN_ID_NOT_STRING = "Campaign identifier must be a String"
NEITHER = "Must provide JSON messages or a CSV file"
BOTH = "Must provide either JSON messages or a CSV file"
USER_ID_MISSING = "Invalid messages : 'user_id' key is missing"
IDEMPOTENCY_CONFLICT = (
    "This Idempotency-Key was already used with a different request body; "
    "use a new key for a new request"
)
MAX_USER_ID = 200


class Missing:
    """Marks a member the caller did not send (``null`` counts as not sent)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = Missing()


class UnreadableMessages:
    """A ``messages`` form field that is not JSON."""


@dataclass(frozen=True)
class StoredUpload:
    """A CSV upload already streamed to storage under ``key``."""

    key: str
    filename: str | None
    content_type: str | None
    head: bytes
    size: int


@dataclass
class TriggerInput:
    """A trigger call as received, before any check (values as the caller sent them)."""

    campaign_id: object = MISSING
    send_at: object = None
    messages: object = MISSING
    upload: StoredUpload | None = None
    file_member: bool = False  # a JSON body that also names a `file`
    misnamed_file: bool = False  # a form's file under another key than `file`
    idempotency_key: str | None = None
    body_hash: str | None = None


def body_hash(payload: object) -> str:
    """A stable hash of a request body, for idempotency keys."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_campaign_id(value: object) -> str:
    if value is MISSING or value is None:
        raise InvalidInput(NO_CAMPAIGN_ID)
    if not isinstance(value, str):
        raise InvalidInput(CAMPAIGN_ID_NOT_STRING)
    if not value.strip():
        raise InvalidInput(EMPTY_CAMPAIGN_ID)
    return value


def ready_campaign(*, session: Session, org_id: int, campaign_id: str) -> Campaign:
    """The organisation's campaign, if started; another organisation's is unknown."""
    campaign = session.get(Campaign, campaign_id) if len(campaign_id) <= 64 else None
    if campaign is None or campaign.org_id != org_id:
        raise CampaignNotFound(f"Unknown campaign with identifier {campaign_id}")
    if campaign.state != CampaignState.started:
        raise CampaignNotReady(f"Campaign with identifier {campaign_id} is not ready")
    return campaign


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def check_messages(value: object, *, variables: Sequence[str], cap: int) -> list[dict[str, Any]]:
    """JSON messages as ``{user_id, template_variables}`` dicts, or InvalidInput."""
    if isinstance(value, UnreadableMessages):
        raise InvalidInput("Invalid messages : the messages field is not valid JSON")
    if not isinstance(value, list):
        raise InvalidInput("Invalid messages : messages must be an array of objects")
    if not value:
        raise InvalidInput(NEITHER)
    if len(value) > cap:
        raise InvalidInput(
            f"Too many messages: at most {cap} per JSON call ({len(value)} given); "
            "send them as a CSV file (multipart/form-data, form key 'file')"
        )
    messages: list[dict[str, Any]] = []
    missing: set[str] = set()
    for message in value:
        if not isinstance(message, dict):
            raise InvalidInput("Invalid messages : each message must be an object")
        if "user_id" not in message or message["user_id"] is None:
            raise InvalidInput(USER_ID_MISSING)
        user_id = message["user_id"]
        if not isinstance(user_id, str):
            raise InvalidInput("Invalid messages : 'user_id' must be a String")
        if not user_id.strip() or "\x00" in user_id:
            raise InvalidInput("Invalid messages : 'user_id' is empty")
        if len(user_id) > MAX_USER_ID:
            raise InvalidInput(
                f"Invalid messages : 'user_id' is longer than {MAX_USER_ID} characters"
            )
        variables_in = message.get("template_variables")
        if variables_in is None:
            variables_in = {}
        if not isinstance(variables_in, dict):
            raise InvalidInput("Invalid messages : 'template_variables' must be an object")
        if not all(_is_scalar(v) for v in variables_in.values()):
            raise InvalidInput(
                "Invalid messages : template variable values must be strings or numbers"
            )
        missing.update(name for name in variables if name not in variables_in)
        messages.append({"user_id": user_id, "template_variables": variables_in})
    if missing:
        raise missing_variables_error([name for name in variables if name in missing])
    return messages


def _replayed(*, session: Session, org_id: int, key: str, digest: str | None) -> str | None:
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
    settings: Settings,
    storage: Storage,
    org_id: int,
    request_id: str,
    trigger: TriggerInput,
    now: datetime | None = None,
) -> str:
    """Check and store a trigger call; returns the request id (the earlier one on replay).

    Blocking (database, file validation): call it from a worker thread. The upload,
    if any, is deleted unless it becomes the request's message file.
    """
    keep_upload = False
    try:
        created = _create(
            settings=settings,
            storage=storage,
            org_id=org_id,
            request_id=request_id,
            trigger=trigger,
            now=now or datetime.now(UTC),
        )
        keep_upload = created == request_id
    finally:
        if trigger.upload is not None and not keep_upload:
            storage.delete(trigger.upload.key)
    if created == request_id:
        scheduling.notify_new_request(request_id)
    return created


def _create(
    *,
    settings: Settings,
    storage: Storage,
    org_id: int,
    request_id: str,
    trigger: TriggerInput,
    now: datetime,
) -> str:
    key = trigger.idempotency_key
    if key is not None:
        with session_scope() as session:
            earlier = _replayed(session=session, org_id=org_id, key=key, digest=trigger.body_hash)
        if earlier is not None:
            return earlier
    campaign_id = check_campaign_id(trigger.campaign_id)
    with session_scope() as session:
        campaign = ready_campaign(session=session, org_id=org_id, campaign_id=campaign_id)
    variables = list(campaign.variables)
    send_at = resolve_send_at(trigger.send_at, now=now)

    has_json = trigger.messages is not MISSING and trigger.messages is not None
    has_file = trigger.upload is not None or trigger.file_member
    if not has_json and not has_file:
        if trigger.misnamed_file:
            raise InvalidInput(f"{NEITHER}: the CSV file must be sent under the form key 'file'")
        raise InvalidInput(NEITHER)
    if has_json and has_file:
        raise InvalidInput(BOTH)

    messages: list[dict[str, Any]] = []
    upload = trigger.upload
    if upload is not None:
        sniff_csv(upload.head, filename=upload.filename, content_type=upload.content_type)
        count = validate_message_file(storage=storage, key=upload.key, variables=variables)
    else:
        messages = check_messages(
            trigger.messages, variables=variables, cap=settings.json_messages_cap
        )
        count = len(messages)

    request = Request(
        id=request_id,
        org_id=org_id,
        campaign_id=campaign_id,
        requested_at=now,
        send_at=send_at,
        source=MessageSource.csv if upload else MessageSource.json,
        message_count=count,
        messages_path=upload.key if upload else None,
        idempotency_key=key,
        body_hash=trigger.body_hash if key else None,
    )
    try:
        with session_scope() as session:
            session.add(request)
            session.flush()
            if messages:
                session.execute(
                    insert(RequestMessage),
                    [
                        {
                            "request_id": request_id,
                            "seq": seq,
                            "user_id": m["user_id"],
                            "template_variables": m["template_variables"],
                        }
                        for seq, m in enumerate(messages)
                    ],
                )
    except IntegrityError:
        if key is None:
            raise
        with session_scope() as session:  # the same key, created concurrently
            earlier = _replayed(session=session, org_id=org_id, key=key, digest=trigger.body_hash)
        if earlier is None:
            raise
        return earlier
    log.info("request %s accepted: %d messages for campaign %s", request_id, count, campaign_id)
    return request_id


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def request_bodies(
    *, session: Session, settings: Settings, requests: Sequence[Request], with_campaign: bool = True
) -> list[dict[str, Any]]:
    """Requests as the API shows them: JSON messages inline, a CSV's file as a signed link."""
    json_ids = [r.id for r in requests if r.source == MessageSource.json]
    messages: dict[str, list[dict[str, Any]]] = {rid: [] for rid in json_ids}
    if json_ids:
        rows = session.exec(
            select(RequestMessage)
            .where(col(RequestMessage.request_id).in_(json_ids))
            .order_by(col(RequestMessage.request_id), col(RequestMessage.seq))
        ).all()
        for row in rows:
            messages[row.request_id].append(
                {"user_id": row.user_id, "template_variables": row.template_variables or {}}
            )
    bodies: list[dict[str, Any]] = []
    for r in requests:
        body: dict[str, Any] = {"request_id": r.id}
        if with_campaign:
            body["campaign_id"] = r.campaign_id
        body["requested_at"] = epoch(r.requested_at)
        body["to_be_send_at"] = epoch(r.send_at)
        if r.source == MessageSource.csv and r.messages_path:
            body["messages"] = signed_url(settings=settings, path=f"/files/{r.messages_path}")
        else:
            body["messages"] = messages.get(r.id, [])
        bodies.append(body)
    return bodies


def request_body(*, session: Session, settings: Settings, request: Request) -> dict[str, Any]:
    """One request as created (the cancel response)."""
    return request_bodies(session=session, settings=settings, requests=[request])[0]
