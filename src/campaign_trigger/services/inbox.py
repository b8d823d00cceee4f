"""In-app delivery: publish rendered messages to the inbox store; apps fetch them.

:func:`publish_inapp` is what an in-app campaign's delivery calls, in the transaction of
the chunk's outcome rows. It bulk-inserts every row in one ``executemany`` (thousands
per call are fine), with one ``published_at`` for the batch, and returns that time: the
``sent_at`` of every row in the report. The caller's transaction commits it, so a
chunk's inbox rows and its outcome rows can be committed together. :func:`fetch_inbox`
is the SDK's read, newest first, paginated by an opaque cursor: only the messages meant
for the user logged in on the device now (none while nobody is), so the next person to
use a shared device never reads the previous user's messages. An entry of a campaign
with a TTL expires ``ttl`` seconds after its publication: it is no longer returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

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
    data: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None


def publish_inapp(
    *,
    session: Session,
    rows: Iterable[InboxEntry],
    published_at: datetime | None = None,
    ttl_seconds: int | None = None,
) -> datetime:
    """Insert the rows into the inbox in bulk; returns the publish time (the ``sent_at``).

    With ``ttl_seconds`` the entries expire that long after it."""
    when = published_at or datetime.now(UTC)
    expires = None if ttl_seconds is None else when + timedelta(seconds=ttl_seconds)
    values = [
        {
            "app_id": row.app_id,
            "device_id": row.device_id,
            "user_id": row.user_id,
            "request_id": row.request_id,
            "campaign_id": row.campaign_id,
            "title": row.title,
            "body": row.body,
            "data": dict(row.data),
            "image": row.image,
            "published_at": when,
            "expires_at": expires,
        }
        for row in rows
    ]
    if values:
        session.execute(insert(InboxMessage), values)
    return when


def _cursor(message: InboxMessage) -> str:
    assert message.id is not None
    return f"{message.published_at.astimezone(UTC).isoformat()}_{message.id}"


MAX_ROW_ID = 2**63 - 1  # the largest id a database integer column holds


def _parse_cursor(cursor: str) -> tuple[datetime, int]:
    """The (time, id) a cursor names; ValueError for anything no page could have given,
    such as an id past a 64-bit integer or a time that has no UTC equivalent."""
    stamp, _, ident = cursor.rpartition("_")
    try:
        moment = datetime.fromisoformat(stamp)
        if moment.tzinfo is None:
            raise ValueError("naive cursor time")
        before, before_id = moment.astimezone(UTC), int(ident)
    except (ValueError, OverflowError):
        raise ValueError("bad cursor") from None
    if not 0 < before_id <= MAX_ROW_ID:
        raise ValueError("bad cursor")
    return before, before_id


def fetch_inbox(
    *,
    session: Session,
    app_id: str,
    device_id: str,
    user_id: str | None,
    limit: int = 50,
    cursor: str | None = None,
    now: datetime | None = None,
) -> tuple[list[InboxMessage], str | None]:
    """A page of the device's unexpired messages for ``user_id`` (the user logged in on
    it; None: nobody, no messages), newest first, and the cursor of the next page."""
    limit = max(1, min(limit, MAX_PAGE))
    if user_id is None:
        if cursor:
            _parse_cursor(cursor)  # a malformed cursor is refused alike
        return [], None
    query = select(InboxMessage).where(
        InboxMessage.app_id == app_id,
        InboxMessage.device_id == device_id,
        InboxMessage.user_id == user_id,
        or_(
            col(InboxMessage.expires_at).is_(None),
            col(InboxMessage.expires_at) > (now or datetime.now(UTC)),
        ),
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
