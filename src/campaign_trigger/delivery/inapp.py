"""In-app delivery: publish rendered messages to the inbox store; apps fetch them.

:func:`publish_inapp` is what an in-app campaign's delivery calls::

    with session_scope() as session:
        sent_at = publish_inapp(session=session, rows=[InboxEntry(...), ...])

It bulk-inserts every row in one ``executemany`` (thousands per call are fine), with
one ``published_at`` for the batch, and returns that time: the ``sent_at`` of every
row in the report. The caller's transaction commits it, so a chunk's inbox rows and
its outcome rows can be committed together. :func:`fetch_inbox` is the SDK's read,
newest first, paginated by an opaque cursor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import insert
from sqlmodel import Session, col, or_, select

from campaign_trigger.store.models import InboxMessage

MAX_PAGE: int = 100


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One rendered in-app message for one device."""

    app_id: str
    device_id: str
    user_id: str
    request_id: str
    campaign_id: str
    title: str
    body: str


def publish_inapp(
    *, session: Session, rows: Iterable[InboxEntry], published_at: datetime | None = None
) -> datetime:
    """Insert the rows into the inbox in bulk; returns the publish time (the ``sent_at``)."""
    when = published_at or datetime.now(UTC)
    values = [
        {
            "app_id": row.app_id,
            "device_id": row.device_id,
            "user_id": row.user_id,
            "request_id": row.request_id,
            "campaign_id": row.campaign_id,
            "title": row.title,
            "body": row.body,
            "published_at": when,
        }
        for row in rows
    ]
    if values:
        session.execute(insert(InboxMessage), values)
    return when


def _cursor(message: InboxMessage) -> str:
    assert message.id is not None
    return f"{message.published_at.astimezone(UTC).isoformat()}_{message.id}"


def _parse_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        stamp, _, ident = cursor.rpartition("_")
        return datetime.fromisoformat(stamp).astimezone(UTC), int(ident)
    except ValueError:
        raise ValueError("bad cursor") from None


def fetch_inbox(
    *, session: Session, app_id: str, device_id: str, limit: int = 50, cursor: str | None = None
) -> tuple[list[InboxMessage], str | None]:
    """A page of the device's messages, newest first, and the cursor of the next page."""
    limit = max(1, min(limit, MAX_PAGE))
    query = select(InboxMessage).where(
        InboxMessage.app_id == app_id, InboxMessage.device_id == device_id
    )
    if cursor:
        before, before_id = _parse_cursor(cursor)
        query = query.where(
            or_(
                col(InboxMessage.published_at) < before,
                (col(InboxMessage.published_at) == before) & (col(InboxMessage.id) < before_id),
            )
        )
    query = query.order_by(col(InboxMessage.published_at).desc(), col(InboxMessage.id).desc())
    page = list(session.exec(query.limit(limit + 1)))
    more = len(page) > limit
    page = page[:limit]
    return page, (_cursor(page[-1]) if more and page else None)
