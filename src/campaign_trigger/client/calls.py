"""Building the API's calls and reading its answers: what both clients share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from campaign_trigger.client.errors import AuthError, error_for
from campaign_trigger.client.models import RequestInfo, ScheduledPage
from campaign_trigger.progress import ReadProgress, progress_bar
from campaign_trigger.schemas.api import Message

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)

MessagesArg = Sequence[Message | Mapping[str, Any]]


def send_at_text(send_at: datetime | str | None) -> str | None:
    if send_at is None or isinstance(send_at, str):
        return send_at
    if send_at.tzinfo is None:
        raise ValueError("send_at must be timezone-aware")
    return send_at.isoformat(timespec="seconds")


def message_json(message: Message | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(message, Message):
        return message.model_dump()
    return dict(message)


@dataclass
class Call:
    """One HTTP call: how to build it, and the files to close once it is sent."""

    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def create_call(
    campaign_id: str,
    *,
    messages: MessagesArg | None,
    csv_path: str | PathLike[str] | None,
    send_at: datetime | str | None,
    idempotency_key: str | None,
    files: ExitStack,
    dry_run: bool = False,
) -> Call:
    if (messages is None) == (csv_path is None):
        raise ValueError("give exactly one of messages or csv_path")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    params = {"dry_run": "true"} if dry_run else {}
    when = send_at_text(send_at)
    if messages is not None:
        body: dict[str, Any] = {
            "campaign_id": campaign_id,
            "messages": [message_json(m) for m in messages],
        }
        if when is not None:
            body["send_at"] = when
        return Call(
            "POST", "/api/campaigns/trigger", {"json": body, "headers": headers, "params": params}
        )
    assert csv_path is not None
    path = Path(csv_path)
    opened = files.enter_context(path.open("rb"))
    handle: IO[bytes] | ReadProgress = opened
    report = files.enter_context(progress_bar(f"Uploading {path.name}", unit="bytes"))
    if report is not None:  # stderr is a terminal: a bar of the bytes sent
        handle = ReadProgress(opened, total=path.stat().st_size, report=report)
    form = {"campaign_id": campaign_id, **({"send_at": when} if when is not None else {})}
    return Call(
        "POST",
        "/api/campaigns/trigger",
        {
            "data": form,
            "files": {"file": (path.name, handle, "text/csv")},
            "headers": headers,
            "params": params,
        },
    )


def scheduled_call(
    campaign_id: str, *, limit: int | None, offset: int | None, after: str | None
) -> Call:
    given = (("limit", limit), ("offset", offset), ("after", after))
    params = {name: value for name, value in given if value is not None}
    return Call(
        "GET", f"/api/campaigns/{segment(campaign_id)}/request/scheduled", {"params": params}
    )


def segment(value: str) -> str:
    """A path segment, percent-encoded (ids are user input)."""

    return quote(value, safe="")


def checked(response: httpx.Response) -> httpx.Response:
    if not response.is_success:  # 200, or 204 for sign-out
        raise error_for(response)
    return response


def token_from(response: httpx.Response) -> str:
    token = response.headers.get("Authorization", "")
    if not token:
        raise AuthError("The sign-in answer carried no token", status_code=response.status_code)
    return token if token.lower().startswith("bearer ") else f"Bearer {token}"


def scheduled_page(response: httpx.Response) -> ScheduledPage:
    body = response.json()
    campaign_id = body["campaign_id"]
    total = response.headers.get("X-Total-Count", "")
    return ScheduledPage(
        campaign_id=campaign_id,
        requests=[RequestInfo(campaign_id=campaign_id, **entry) for entry in body["requests"]],
        total=int(total) if total.isdigit() else None,
    )


def cancelled(response: httpx.Response) -> RequestInfo:
    body = dict(response.json())
    if "messages" not in body and "Messages" in body:  # the spec's sample spells it so
        body["messages"] = body.pop("Messages")
    return RequestInfo.model_validate(body)
