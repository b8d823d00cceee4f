"""Pydantic models of the HTTP API's bodies (for validation and the OpenAPI page)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorBody(BaseModel):
    """Every non-200 answer."""

    error_message: str = Field(description="What went wrong, in words meant for people.")


class Credentials(BaseModel):
    email: str = Field(description="The account's e-mail.")
    password: str = Field(description="The account's password.")


class SignInBody(BaseModel):
    """`{"user": {"email": ..., "password": ...}}`."""

    user: Credentials


class SignedIn(BaseModel):
    """The signed-in account; the token is in the `Authorization` response header."""

    email: str
    role: str
    organisation: str


class MessageIn(BaseModel):
    """One message of a JSON trigger call (documentation; the body is checked by hand)."""

    model_config = ConfigDict(extra="allow")

    user_id: str = Field(description="The user to whom the message is sent.")
    template_variables: dict[str, Any] | None = Field(
        default=None, description="Template variable name to the value for this user."
    )


class TriggerJson(BaseModel):
    """Method A: JSON messages."""

    campaign_id: str = Field(description="Campaign identifier (from the console).")
    send_at: str | None = Field(
        default=None,
        description="ISO 8601 with a UTC offset, basic `20261122T101500+0100` or extended "
        "`2026-11-22T10:15:00+01:00`; at most 5 minutes in the past; default now.",
    )
    messages: list[MessageIn] = Field(description="The messages, at most `json_messages_cap`.")


class TriggerForm(BaseModel):
    """Method B: multipart form-data with a CSV file under the key `file`."""

    campaign_id: str = Field(description="Campaign identifier (from the console).")
    send_at: str | None = Field(default=None, description="As for the JSON method.")
    file: bytes = Field(
        description="UTF-8 CSV, `,` separated, a `User` column and one column per campaign "
        "variable, one row per user; at most 1 GB.",
        json_schema_extra={"format": "binary"},
    )


class RequestCreated(BaseModel):
    request_id: str


class Message(BaseModel):
    user_id: str
    template_variables: dict[str, Any]


class RequestOut(BaseModel):
    """A request as created. `messages` is a signed link to the message file of a CSV request."""

    request_id: str
    campaign_id: str
    requested_at: int = Field(description="Epoch seconds.")
    to_be_send_at: int = Field(description="Epoch seconds.")
    messages: list[Message] | str


class ScheduledRequest(BaseModel):
    request_id: str
    requested_at: int = Field(description="Epoch seconds.")
    to_be_send_at: int = Field(description="Epoch seconds.")
    messages: list[Message] | str


class ScheduledList(BaseModel):
    """One page of a campaign's scheduled requests; the total is in `X-Total-Count`."""

    campaign_id: str
    requests: list[ScheduledRequest]


class Reports(BaseModel):
    request_id: str
    reports: list[str] = Field(description="Signed links to CSV report files, valid 1 hour.")
