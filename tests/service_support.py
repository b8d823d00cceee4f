"""Seeding helpers of the service unit tests (importable by name: ``from service_support
import ...``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlmodel import Session

from campaign_trigger.store.models import (
    App,
    Campaign,
    CampaignApp,
    CampaignState,
    Channel,
    MessageSource,
    Organisation,
    Outcome,
    Platform,
    Request,
)


@dataclass(frozen=True)
class Org:
    org_id: int
    campaign_id: str
    app_id: str


def make_org(session: Session, *, state: CampaignState = CampaignState.started) -> Org:
    """An organisation with an Android app and a campaign of variables ``first_name, code``."""
    tag = uuid.uuid4().hex[:8]
    org = Organisation(name=f"org-{tag}")
    session.add(org)
    session.flush()
    assert org.id is not None
    app = App(app_id=f"app-{tag}", org_id=org.id, platform=Platform.android, sdk_key=tag)
    campaign = Campaign(
        org_id=org.id,
        channel=Channel.push,
        state=state,
        title="Hi {{ first_name }}",
        body="Code {{ code }}",
        variables=["first_name", "code"],
    )
    session.add_all([app, campaign])
    session.flush()
    session.add(CampaignApp(campaign_id=campaign.id, app_id=app.app_id))
    session.commit()
    return Org(org_id=org.id, campaign_id=campaign.id, app_id=app.app_id)


def add_json_request(session: Session, org: Org, *, message_count: int = 3) -> str:
    """A request of ``org``'s campaign, JSON messages, due now (committed); its id."""
    request = Request(
        org_id=org.org_id,
        campaign_id=org.campaign_id,
        send_at=datetime.now(UTC),
        source=MessageSource.json,
        message_count=message_count,
    )
    session.add(request)
    session.commit()
    return request.id


def add_outcomes(
    session: Session, org: Org, request_id: str, errors: Sequence[str], *, first: int = 0
) -> None:
    """Push outcome rows of the request (committed): row ``first + n`` of user ``u<row>``
    for the org's app, with ``errors[n]`` (``""``: sent)."""
    session.add_all(
        Outcome(
            request_id=request_id,
            row_no=n,
            app_id=org.app_id,
            user_id=f"u{n}",
            channel=Channel.push,
            error_message=error,
        )
        for n, error in enumerate(errors, start=first)
    )
    session.commit()
