"""Pydantic models of the completion-webhook routes (``api/webhooks.py``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from campaign_trigger.services.webhooks import MAX_URL_LENGTH


class WebhookCreate(BaseModel):
    """An endpoint to register."""

    url: str = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Where events are POSTed: an `https://` URL (any `http(s)://` URL when "
        "the service runs in sandbox mode, `CT_SEND_TO_SANDBOX`).",
    )


class WebhookPublic(BaseModel):
    """A registered endpoint (its secret is never shown again)."""

    id: str
    url: str
    created_at: datetime


class WebhookRegistered(WebhookPublic):
    """A new endpoint, with the secret that signs its events."""

    secret: str = Field(
        description="Shown this once: verify each event's `Campaign-Trigger-Signature` "
        "with it (`campaign_trigger.client.verify_signature`)."
    )


class WebhookList(BaseModel):
    webhooks: list[WebhookPublic]


class WebhookAttemptOut(BaseModel):
    """One POST of an event to the endpoint."""

    event_id: str = Field(description="The event's id: the same on every attempt of it.")
    event_type: str = Field(
        description="`request.processed`, `request.cancelled` or `request.failed`."
    )
    request_id: str
    attempted_at: datetime
    status_code: int | None = Field(description="The receiver's HTTP status; null if none.")
    error: str | None = Field(
        description="Why the attempt failed (a non-2xx status, a timeout, a refused "
        "connection); null when the event was accepted."
    )
    duration_ms: int


class WebhookAttempts(BaseModel):
    attempts: list[WebhookAttemptOut] = Field(description="Newest first.")
