"""Pydantic models of the HTTP API's bodies (for validation and the OpenAPI page)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from campaign_trigger.schemas.text import StorableStr


class ErrorBody(BaseModel):
    """Every non-200 answer."""

    error_message: str = Field(description="What went wrong, in words meant for people.")


class Credentials(BaseModel):
    email: StorableStr = Field(max_length=320, description="The account's e-mail.")
    password: StorableStr = Field(max_length=1024, description="The account's password.")


class SignInBody(BaseModel):
    """`{"user": {"email": ..., "password": ...}}`."""

    user: Credentials


class SignedIn(BaseModel):
    """The signed-in account; the token is in the `Authorization` response header."""

    email: str
    role: str
    organisation: str


TemplateValue = str | int | float | bool | None


class Message(BaseModel):
    """One message: a user and the value of each template variable for them.

    The one message model: the API documents its JSON body with it (and checks the body
    by hand, for the spec's error texts), the ``send-batch`` flow takes it (the Prefect
    UI renders it as a form) and the Python client sends and returns it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: str = Field(
        min_length=1, max_length=200, description="The user to whom the message is sent."
    )
    template_variables: dict[str, TemplateValue] = Field(
        default_factory=dict,
        description='Template variable name to value for this user, e.g. {"first_name": "Ada"}; '
        "every variable of the campaign's message must be given. The message shows each "
        "value's text exactly: a string as is, a number as the API's JSON body wrote it "
        "(`2.00` stays `2.00`), `true`/`false`, and `null` as empty. Through the Prefect "
        "form or Python a number arrives parsed and shows as Python writes it (`2.0`, "
        '`1000.0` for `1e3`): quote a value whose form matters ("2.00").',
    )

    @field_validator("template_variables", mode="before")
    @classmethod
    def _null_is_none(cls, value: object) -> object:
        return {} if value is None else value


class TriggerJson(BaseModel):
    """Method A: JSON messages."""

    campaign_id: str = Field(description="Campaign identifier (from the console).")
    send_at: str | None = Field(
        default=None,
        description="ISO 8601 with a UTC offset, basic `20261122T101500+0100` or extended "
        "`2026-11-22T10:15:00+01:00`; at most 5 minutes in the past; default now.",
    )
    messages: list[Message] = Field(description="The messages, at most `json_messages_cap`.")


class TriggerForm(BaseModel):
    """Method B: multipart form-data with a CSV file under the key `file`."""

    campaign_id: str = Field(description="Campaign identifier (from the console).")
    send_at: str | None = Field(default=None, description="As for the JSON method.")
    file: bytes = Field(
        description="UTF-8 CSV, `,` separated, a `User` column and one column per campaign "
        "variable, one row per user; at most 1 GB. Every cell is text, delivered exactly "
        "as written (after CSV unquoting): `007`, `NA` and `TRUE` stay what they are.",
        json_schema_extra={"format": "binary"},
    )


class RequestCreated(BaseModel):
    request_id: str


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
