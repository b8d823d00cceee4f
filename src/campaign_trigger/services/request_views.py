"""A request as the API shows it: the cancel answer and the scheduled list's entries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.models import MessageSource, Request, RequestMessage


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def request_bodies(
    *, session: Session, settings: Settings, requests: Sequence[Request], with_campaign: bool = True
) -> list[dict[str, Any]]:
    """Requests as the API shows them: JSON messages inline, a CSV's file as a signed link."""
    json_ids = [r.id for r in requests if r.source == MessageSource.json]
    messages: dict[str, list[dict[str, Any]]] = {rid: [] for rid in json_ids}
    if json_ids:
        # Columns through Core, not the ORM's loading (a page holds up to 100 x 1,000
        # messages; the ORM's row handling was half of a list's CPU).
        rows = session.connection().execute(
            select(
                col(RequestMessage.request_id),
                col(RequestMessage.user_id),
                col(RequestMessage.template_variables),
            )
            .where(col(RequestMessage.request_id).in_(json_ids))
            .order_by(col(RequestMessage.request_id), col(RequestMessage.seq))
        )
        for request_id, user_id, variables in rows:
            messages[request_id].append({"user_id": user_id, "template_variables": variables or {}})
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
