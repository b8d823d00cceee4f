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


def _message_rows(
    session: Session, json_ids: list[str], *, stored_text: bool
) -> Sequence[tuple[str, str, Any]]:
    """(request id, user id, template variables) of the requests' messages, in order;
    the variables decoded, or with ``stored_text`` as the JSON text the database holds.

    Columns through Core, not the ORM's loading (a page holds up to 100 x 1,000
    messages; the ORM's row handling was half of a list's CPU)."""
    variables = col(RequestMessage.template_variables)
    return (
        session.connection()
        .execute(  # type: ignore[return-value]
            select(
                col(RequestMessage.request_id),
                col(RequestMessage.user_id),
                cast(variables, Text) if stored_text else variables,
            )
            .where(col(RequestMessage.request_id).in_(json_ids))
            .order_by(col(RequestMessage.request_id), col(RequestMessage.seq))
        )
        .all()
    )


def _times(request: Request) -> dict[str, Any]:
    return {"requested_at": epoch(request.requested_at), "to_be_send_at": epoch(request.send_at)}


def _file_link(settings: Settings, request: Request) -> str | None:
    if request.source == MessageSource.csv and request.messages_path:
        return signed_url(settings=settings, path=f"/files/{request.messages_path}")
    return None


def request_body(*, session: Session, settings: Settings, request: Request) -> dict[str, Any]:
    """One request as created (the cancel response): JSON messages inline, a CSV's file
    as a signed link."""
    messages: list[dict[str, Any]] = []
    if json_ids := _json_ids([request]):
        messages = [
            {"user_id": user_id, "template_variables": variables or {}}
            for _, user_id, variables in _message_rows(session, json_ids, stored_text=False)
        ]
    link = _file_link(settings, request)
    body: dict[str, Any] = {"request_id": request.id, "campaign_id": request.campaign_id}
    return {**body, **_times(request), "messages": messages if link is None else link}


def scheduled_page(
    *, session: Session, settings: Settings, campaign_id: str, requests: Sequence[Request]
) -> bytes:
    """The scheduled list's answer (``ScheduledList``'s shape) as JSON text.

    Each message's ``template_variables`` is spliced in as the database stores it
    (JSON already), not decoded and encoded again: a page holds up to 100 x 1,000
    messages, and decoding them was most of a list's CPU."""
    messages: dict[str, list[str]] = {rid: [] for rid in _json_ids(requests)}
    if messages:
        for request_id, user_id, variables in _message_rows(
            session, list(messages), stored_text=True
        ):
            stored = variables if variables and variables != "null" else "{}"
            messages[request_id].append(
                f'{{"user_id":{json_text(user_id)},"template_variables":{stored}}}'
            )
    entries = []
    for r in requests:
        head = json_text({"request_id": r.id, **_times(r)})
        link = _file_link(settings, r)
        listed = json_text(link) if link is not None else f"[{','.join(messages.get(r.id, []))}]"
        entries.append(f'{head[:-1]},"messages":{listed}}}')
    page = f'{{"campaign_id":{json_text(campaign_id)},"requests":[{",".join(entries)}]}}'
    return page.encode()
