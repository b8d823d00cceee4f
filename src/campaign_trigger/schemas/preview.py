"""The preview of a trigger call (``?dry_run=true``; ``send-batch`` with ``dry_run``).

One model for the API's answer, the flow's result and the Python client's return value.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

PREVIEW_ROWS = 20
"""Messages shown rendered, and payload problems listed, at most."""


class AppAudience(BaseModel):
    """Whom the request reaches in one app of the campaign."""

    app_id: str
    platform: str = Field(description="`android` or `ios`.")
    devices: int = Field(description="Devices of the messages' users in this app.")
    to_send: int = Field(description="Of those, the devices a message would be sent to.")
    not_sent: dict[str, int] = Field(
        default_factory=dict,
        description="Devices not sent to, per pre-send outcome of the report "
        "(`Opt out`, `Last user not logged in`, `App uninstalled`).",
    )


class RenderedMessage(BaseModel):
    """One message as one provider (or the in-app inbox) would receive it."""

    title: str | None = Field(description="The rendered title (none for a silent push).")
    body: str | None = Field(description="The rendered body (none for a silent push).")
    payload: dict[str, Any] | None = Field(
        default=None,
        description="The provider payload built by the delivery code: FCM's `message` "
        "without its `token`, or the APNs JSON body; none for in-app messages or when "
        "the payload would be refused (see `error`).",
    )
    payload_bytes: int | None = Field(
        default=None,
        description="The size the provider's 4 KB limit applies to (FCM: `notification`, "
        "`data` and `android`; APNs: the whole body).",
    )
    error: str | None = Field(
        default=None, description="Why the provider would refuse it (`FPErrJSONMarshalling`)."
    )


class PreviewMessage(BaseModel):
    """One of the first messages of the request, rendered."""

    row: int = Field(
        description=(
            "Where the message is in what was sent: its row in a CSV file (the header is "
            "row 1, blank lines are not counted), or its place in a JSON list (from 1)."
        )
    )
    user_id: str
    rendered: dict[str, RenderedMessage] = Field(
        description="Per platform of the campaign's apps (`android`, `ios`), or `inapp`."
    )


class PayloadProblem(BaseModel):
    """A message whose payload a provider would refuse: over 4 KB, or not serialisable."""

    row: int = Field(
        description=(
            "Where the message is in what was sent: its row in a CSV file (the header is "
            "row 1, blank lines are not counted), or its place in a JSON list (from 1)."
        )
    )
    user_id: str
    platform: str
    error: str


class TriggerPreview(BaseModel):
    """What a trigger call would send: nothing is stored, scheduled or sent."""

    dry_run: Literal[True] = True
    campaign_id: str
    channel: str = Field(description="`push` or `inapp`.")
    send_at: int = Field(description="When it would be sent, epoch seconds.")
    message_count: int
    users_without_device: int = Field(
        description="Messages whose user has no device in any app of the campaign "
        "(reported `No device for user`)."
    )
    apps: list[AppAudience] = Field(description="Devices per app of the campaign.")
    devices_per_platform: dict[str, int] = Field(
        description="Devices a message would be sent to, per platform."
    )
    messages: list[PreviewMessage] = Field(
        description=f"The first {PREVIEW_ROWS} messages, rendered per platform."
    )
    payload_error_count: int = Field(
        description="Payloads a provider would refuse (over 4 KB or not serialisable), "
        "counted over every message and platform; delivered as `FPErrJSONMarshalling`."
    )
    payload_errors: list[PayloadProblem] = Field(description=f"The first {PREVIEW_ROWS} of them.")
