"""Finding an organisation's campaign or request by the id a caller gave.

Another organisation's campaign or request is as unknown as one that does not exist
(DESIGN §4), and an id no row can have (longer than 64 characters, or holding what
the database cannot store: NUL, a lone surrogate) is unknown without a query.
"""

from __future__ import annotations

from typing import Final

from sqlmodel import Session

from campaign_trigger.schemas.text import storable
from campaign_trigger.store.models import Campaign, Request

MAX_ID: Final = 64  # campaign and request ids: no such id is longer


def could_exist(identifier: str) -> bool:
    """Whether a row could have this id."""
    return len(identifier) <= MAX_ID and storable(identifier)


def campaign(*, session: Session, campaign_id: str) -> Campaign | None:
    """The campaign, whoever owns it (for the flows, which act for its organisation)."""
    return session.get(Campaign, campaign_id) if could_exist(campaign_id) else None


def org_campaign(*, session: Session, org_id: int, campaign_id: str) -> Campaign | None:
    """The organisation's campaign, or None."""
    found = campaign(session=session, campaign_id=campaign_id)
    return found if found is not None and found.org_id == org_id else None


def org_request(*, session: Session, org_id: int, request_id: str) -> Request | None:
    """The organisation's request, or None."""
    found = session.get(Request, request_id) if could_exist(request_id) else None
    return found if found is not None and found.org_id == org_id else None
