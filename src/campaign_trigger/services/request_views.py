"""A request as the API shows it: the cancel answer and the scheduled list's entries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.models import MessageSource, Request, RequestMessage

# What starlette's JSONResponse writes, for the parts of an answer built as text here
# (one encoder: json.dumps with options makes one per call).
json_text = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def _json_ids(requests: Sequence[Request]) -> list[str]:
    return [r.id for r in requests if r.source == MessageSource.json]


def _message_rows(session: Session, json_ids: list[str]) -> Sequence[tuple[str, str, str]]:
    """(request id, user id, template variables as the JSON text the database holds) of
    the requests' messages, in order. The text is spliced into the answers as it is:
    numbers as the body wrote them (``json_text.dumps`` stored them), and a page of up
    to 100 x 1,000 messages not decoded and encoded again (that was most of a list's
    CPU).

    Columns through Core, not the ORM's loading (the ORM's row handling was half of a
    list's CPU)."""
    variables = col(RequestMessage.template_variables)
    return (
        session.connection()
        .execute(  # type: ignore[return-value]
            select(
                col(RequestMessage.request_id),
                col(RequestMessage.user_id),
                cast(variables, Text),
            )
            .where(col(RequestMessage.request_id).in_(json_ids))
            .order_by(col(RequestMessage.request_id), col(RequestMessage.seq))
        )
        .all()
    )


def _messages_json(session: Session, requests: Sequence[Request]) -> dict[str, list[str]]:
    """Each JSON request's messages as JSON texts (a CSV request has none)."""
    messages: dict[str, list[str]] = {rid: [] for rid in _json_ids(requests)}
    if messages:
        for request_id, user_id, variables in _message_rows(session, list(messages)):
            stored = variables if variables and variables != "null" else "{}"
            messages[request_id].append(
                f'{{"user_id":{json_text(user_id)},"template_variables":{stored}}}'
            )
    return messages


def _request_json(
    settings: Settings, request: Request, messages: dict[str, list[str]], **head: Any
) -> str:
    """One request as JSON text: ``request_id``, ``head``, its times, its messages (a
    CSV request's: a signed link to its file)."""
    start = json_text({"request_id": request.id, **head, **_times(request)})
    link = _file_link(settings, request)
    listed = json_text(link) if link is not None else f"[{','.join(messages.get(request.id, []))}]"
    return f'{start[:-1]},"messages":{listed}}}'


def _times(request: Request) -> dict[str, Any]:
    return {"requested_at": epoch(request.requested_at), "to_be_send_at": epoch(request.send_at)}


def _file_link(settings: Settings, request: Request) -> str | None:
    if request.source == MessageSource.csv and request.messages_path:
        return signed_url(settings=settings, path=f"/files/{request.messages_path}")
    return None


def request_body(*, session: Session, settings: Settings, request: Request) -> bytes:
    """One request as created (the cancel response, ``RequestOut``'s shape) as JSON
    text: JSON messages inline, a CSV's file as a signed link."""
    messages = _messages_json(session, [request])
    return _request_json(settings, request, messages, campaign_id=request.campaign_id).encode()


def scheduled_page(
    *, session: Session, settings: Settings, campaign_id: str, requests: Sequence[Request]
) -> bytes:
    """The scheduled list's answer (``ScheduledList``'s shape) as JSON text."""
    messages = _messages_json(session, requests)
    entries = ",".join(_request_json(settings, r, messages) for r in requests)
    return f'{{"campaign_id":{json_text(campaign_id)},"requests":[{entries}]}}'.encode()
