"""SQLModel tables: the service's data. Timestamps are timezone-aware UTC.

Every table is migrated by Alembic (``store/migrations``); change a table here,
then add a migration (``alembic revision --autogenerate``) in the same commit.
"""

from __future__ import annotations

import enum
import secrets
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Dialect, Index, Text, UniqueConstraint, text
from sqlalchemy import Enum as SAEnum
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def new_identity_key() -> str:
    """A fresh identity-verification key (256 random bits)."""
    return f"idk_{secrets.token_urlsafe(32)}"


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite keeps naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given for a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Role(enum.StrEnum):
    owner = "owner"
    admin = "admin"
    member = "member"
    viewer = "viewer"


class Platform(enum.StrEnum):
    android = "android"
    ios = "ios"


class Channel(enum.StrEnum):
    push = "push"
    inapp = "inapp"


class CampaignState(enum.StrEnum):
    draft = "draft"
    started = "started"
    ended = "ended"


class RequestState(enum.StrEnum):
    """Mirror of the flow run's state, for queries. Prefect's state wins."""

    scheduled = "scheduled"
    running = "running"
    processed = "processed"
    canceled = "canceled"
    failed = "failed"


class PushService(enum.StrEnum):
    fcm = "fcm"
    apns = "apns"


class ApnsEnvironment(enum.StrEnum):
    """Which APNs endpoint an iOS app's tokens belong to."""

    production = "production"
    development = "development"


class PushPriority(enum.StrEnum):
    high = "high"
    normal = "normal"


class MessageSource(enum.StrEnum):
    json = "json"
    csv = "csv"


def _enum(kind: type[enum.StrEnum]) -> Any:
    """Enums stored as short strings (no database enum types to migrate)."""
    return SAEnum(
        kind, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]
    )


class Organisation(SQLModel, table=True):
    """A subscription: its accounts, apps and campaigns, and its request quota."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, min_length=1, max_length=200)
    request_quota: int = Field(default=10_000, ge=0)
    quota_period: str = Field(default="monthly", max_length=16)
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class Account(SQLModel, table=True):
    """A person who signs in to the API."""

    id: int | None = Field(default=None, primary_key=True)
    org_id: int = Field(foreign_key="organisation.id", index=True)
    email: str = Field(unique=True, min_length=3, max_length=320)
    password_hash: str
    role: Role = Field(default=Role.member, sa_type=_enum(Role))
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class App(SQLModel, table=True):
    """A mobile app of an organisation; its SDK key authenticates device calls.

    With ``identity_verification`` on, logging a user in on a device needs the HMAC-SHA256
    of the user id under ``identity_key``, made by the tenant's back-end.
    """

    id: int | None = Field(default=None, primary_key=True)
    app_id: str = Field(unique=True, min_length=1, max_length=200)
    org_id: int = Field(foreign_key="organisation.id", index=True)
    platform: Platform = Field(sa_type=_enum(Platform))
    sdk_key: str = Field(unique=True, max_length=128)
    identity_key: str = Field(default_factory=new_identity_key, max_length=128)
    identity_verification: bool = False
    provider_auth_failed_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class AppCredentials(SQLModel, table=True):
    """An app's own provider credentials (``services/app_credentials.py``).

    The secret — the whole service-account JSON for FCM, the ``.p8`` key for APNs — is
    only ever stored sealed (AES-256-GCM, ``services/sealed.py``); the other columns are
    what an operator may see. ``version`` grows with every change: a worker's pooled
    provider of an older version is replaced at its next chunk.
    """

    app_id: str = Field(foreign_key="app.app_id", primary_key=True, max_length=200)
    service: PushService = Field(sa_type=_enum(PushService))
    key_id: str = Field(max_length=128)  # FCM private_key_id / APNs key id
    project_id: str | None = Field(default=None, max_length=200)  # FCM
    client_email: str | None = Field(default=None, max_length=320)  # FCM
    team_id: str | None = Field(default=None, max_length=64)  # APNs
    topic: str | None = Field(default=None, max_length=200)  # APNs bundle id
    environment: ApnsEnvironment | None = Field(default=None, sa_type=_enum(ApnsEnvironment))
    public_key_sha256: str = Field(max_length=64)  # fingerprint of the public half
    sealed_secret: str = Field(sa_column=Column(Text, nullable=False))
    version: int = Field(default=1, ge=1)
    updated_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class Campaign(SQLModel, table=True):
    """An API-trigger campaign: a template sent to one or more apps."""

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    org_id: int = Field(foreign_key="organisation.id", index=True)
    channel: Channel = Field(sa_type=_enum(Channel))
    state: CampaignState = Field(default=CampaignState.draft, sa_type=_enum(CampaignState))
    title: str = Field(sa_column=Column(Text, nullable=False))
    body: str = Field(sa_column=Column(Text, nullable=False))
    # key -> template, rendered per user like title and body (push data / in-app data)
    data: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    image: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # a template
    sound: str | None = Field(default=None, max_length=200)
    badge: int | None = Field(default=None, ge=0)
    priority: PushPriority = Field(default=PushPriority.high, sa_type=_enum(PushPriority))
    ttl_seconds: int | None = Field(default=None, ge=0)  # push expiry; in-app expires_at
    interruption_level: str | None = Field(default=None, max_length=32)
    thread_id: str | None = Field(default=None, max_length=200)
    category: str | None = Field(default=None, max_length=200)
    silent: bool = False  # APNs background push / FCM data-only message
    variables: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class CampaignApp(SQLModel, table=True):
    """Which apps a campaign sends to."""

    campaign_id: str = Field(foreign_key="campaign.id", primary_key=True, max_length=64)
    app_id: str = Field(foreign_key="app.app_id", primary_key=True, max_length=200)


class Device(SQLModel, table=True):
    """One install of an app, with the user last logged in on it.

    ``secret_hash`` is the SHA-256 of the device secret handed to the install when it
    registered; None for a device imported by an operator and not yet claimed.

    A push token belongs to one device of an app: the device registered or imported with
    it last. The others that held it lose it and count as uninstalled (the same phone
    reinstalled the app, or gave the token to a new install); ``ix_device_push_token``
    finds them (a hash index on PostgreSQL: a token may be 4096 characters, past a
    B-tree's limit; uniqueness is kept by the writers, ``services/devices.py`` and
    ``services/device_import.py``, migration 0008; on PostgreSQL a send also skips an
    older holder a concurrent import left, ``services/audience.py``).
    """

    __table_args__ = (
        UniqueConstraint("app_id", "device_id"),
        Index("ix_device_app_user", "app_id", "user_id"),
        Index(
            "ix_device_push_token",
            "push_token",
            postgresql_using="hash",
            postgresql_where=text("push_token IS NOT NULL"),
            sqlite_where=text("push_token IS NOT NULL"),
        ),
        # half of each page free: a re-import's new tokens are HOT updates (migration 0007)
        {"postgresql_with": {"fillfactor": 50}},
    )

    id: int | None = Field(default=None, primary_key=True)
    app_id: str = Field(foreign_key="app.app_id", max_length=200)
    device_id: str = Field(min_length=1, max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    push_token: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    secret_hash: str | None = Field(default=None, max_length=64)
    opted_in: bool = True
    logged_in: bool = True
    unregistered_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    uninstalled_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    updated_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class Request(SQLModel, table=True):
    """A batch: the messages of one trigger call, delivered by one flow run."""

    __table_args__ = (
        Index("ix_request_campaign_state", "campaign_id", "state"),
        Index("ix_request_outbox", "flow_run_id", "state"),
        UniqueConstraint("org_id", "idempotency_key"),
    )

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    org_id: int = Field(foreign_key="organisation.id", index=True)
    campaign_id: str = Field(foreign_key="campaign.id", max_length=64)
    requested_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )
    send_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    source: MessageSource = Field(sa_type=_enum(MessageSource))
    message_count: int = Field(default=0, ge=0)
    messages_path: str | None = Field(default=None, max_length=1000)
    chunk_size: int = Field(default=5000, gt=0)  # fixed at creation: re-runs chunk alike
    state: RequestState = Field(default=RequestState.scheduled, sa_type=_enum(RequestState))
    flow_run_id: str | None = Field(default=None, max_length=64)
    run_owner: str | None = Field(default=None, max_length=128)  # the worker running it
    idempotency_key: str | None = Field(default=None, max_length=200)
    body_hash: str | None = Field(default=None, max_length=128)
    processed_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    report_paths: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class RequestMessage(SQLModel, table=True):
    """One message of a JSON request as the caller sent it (for the API's answers).

    Delivery never reads these: every request's messages are in its message file
    (``services/message_file.py``), values as text.
    """

    request_id: str = Field(foreign_key="request.id", primary_key=True, max_length=64)
    seq: int = Field(primary_key=True, ge=0)
    user_id: str = Field(max_length=200)
    template_variables: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )


class DeliveredChunk(SQLModel, table=True):
    """A chunk whose outcomes are recorded: never sent again (written with its outcomes)."""

    request_id: str = Field(foreign_key="request.id", primary_key=True, max_length=64)
    chunk_no: int = Field(primary_key=True, ge=0)
    recorded_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class Outcome(SQLModel, table=True):
    """One report row: what happened to one message on one device (or why it was not sent).

    At most one row per (request, app, message row, device): a message recorded for a
    device is never sent to it again (``services/delivering.py``).
    """

    __table_args__ = (
        UniqueConstraint(
            "request_id", "app_id", "row_no", "device_id", name="uq_outcome_request_app_row_device"
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(foreign_key="request.id", max_length=64)
    row_no: int = Field(ge=0)  # the message's position in the request (0-based)
    app_id: str = Field(max_length=200)
    user_id: str = Field(max_length=200)
    device_id: str = Field(default="", max_length=200)
    channel: Channel = Field(sa_type=_enum(Channel))
    sent_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    error_message: str = Field(default="", max_length=64)


class InboxMessage(SQLModel, table=True):
    """An in-app message published to a device's inbox."""

    __table_args__ = (Index("ix_inbox_device", "app_id", "device_id", "published_at"),)

    id: int | None = Field(default=None, primary_key=True)
    app_id: str = Field(max_length=200)
    device_id: str = Field(max_length=200)
    user_id: str = Field(max_length=200)
    request_id: str = Field(max_length=64)
    campaign_id: str = Field(max_length=64)
    title: str = Field(sa_column=Column(Text, nullable=False))
    body: str = Field(sa_column=Column(Text, nullable=False))
    data: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    image: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    published_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )
    expires_at: datetime | None = Field(  # from the campaign's TTL; not shown after it
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )


class QuotaUsage(SQLModel, table=True):
    """Request-quota units an organisation used in one period (``2026-11`` or ``2026-11-22``)."""

    org_id: int = Field(foreign_key="organisation.id", primary_key=True)
    period: str = Field(primary_key=True, max_length=16)
    used: int = Field(default=0, ge=0)


class RevokedToken(SQLModel, table=True):
    """A signed-out token id, kept until the token would have expired anyway."""

    jti: str = Field(primary_key=True, max_length=64)
    expires_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class SignInFailure(SQLModel, table=True):
    """One failed sign-in, counted against an account or a client address.

    ``key`` is ``account:`` or ``address:`` and the SHA-256 of the e-mail or address.
    An attempt is written when it starts (so that concurrent attempts, in any process,
    see each other) and deleted if it succeeds.
    """

    __table_args__ = (
        Index("ix_signinfailure_key_time", "key", "failed_at"),
        Index("ix_signinfailure_time", "failed_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=80)
    failed_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class WebhookEndpoint(SQLModel, table=True):
    """A URL an organisation registered for completion events (``services/webhooks.py``).

    The signing secret is shown once, at registration, and stored only sealed.
    """

    id: str = Field(primary_key=True, max_length=64)  # whk_...
    org_id: int = Field(foreign_key="organisation.id", index=True)
    url: str = Field(sa_column=Column(Text, nullable=False))
    sealed_secret: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )


class WebhookDelivery(SQLModel, table=True):
    """One event for one endpoint: the webhooks' outbox, written in the transaction that
    gives the request its final state; the sender takes the due rows (``next_attempt_at``)
    until one attempt is accepted or the retry window closes, each after the events queued
    before it for its request and endpoint (``ix_webhookdelivery_waiting`` finds those still
    to be tried, migration 0009)."""

    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id"),
        Index("ix_webhookdelivery_due", "next_attempt_at"),
        Index(
            "ix_webhookdelivery_waiting",
            "request_id",
            "endpoint_id",
            postgresql_where=text("next_attempt_at IS NOT NULL"),
            sqlite_where=text("next_attempt_at IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    endpoint_id: str = Field(foreign_key="webhookendpoint.id", max_length=64)
    event_id: str = Field(max_length=64)  # evt_...: the same on every attempt
    event_type: str = Field(max_length=64)
    request_id: str = Field(max_length=64)
    payload: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(
        default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False)
    )
    next_attempt_at: datetime | None = Field(  # None: delivered, or given up
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    attempt_count: int = Field(default=0, ge=0)
    delivered_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )


class WebhookAttempt(SQLModel, table=True):
    """One POST of an event to an endpoint: its answer's status, or the error."""

    __table_args__ = (Index("ix_webhookattempt_delivery", "delivery_id"),)

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: int = Field(foreign_key="webhookdelivery.id")
    attempted_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    status_code: int | None = None
    error: str | None = Field(default=None, max_length=300)
    duration_ms: int = Field(ge=0)
