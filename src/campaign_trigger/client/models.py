"""What the client's calls return: validated answers of the API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from campaign_trigger.schemas.api import Message


class CreatedRequest(BaseModel):
    """The answer to a create: the new request's id."""

    request_id: str


class RequestInfo(BaseModel):
    """A request as created: its messages, or a signed link to its message file (CSV)."""

    request_id: str
    campaign_id: str
    requested_at: datetime = Field(description="Timezone-aware (UTC).")
    to_be_send_at: datetime = Field(description="Timezone-aware (UTC).")
    messages: list[Message] | str

    @property
    def messages_url(self) -> str | None:
        """The link to the message file of a CSV request (None for a JSON request)."""
        return self.messages if isinstance(self.messages, str) else None


class ScheduledPage(BaseModel):
    """One page of a campaign's scheduled requests; ``total`` counts every page."""

    campaign_id: str
    requests: list[RequestInfo]
    total: int | None = None


class Report(BaseModel):
    """Links to the CSV report files of a processed request (valid one hour)."""

    request_id: str
    reports: list[str]
