"""The demo tenant's campaign shows a complete payload: a per-user deep link."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Session

from campaign_trigger.services import demo
from campaign_trigger.store.models import Campaign


def test_the_demo_campaign_carries_a_deep_link_of_its_variables(
    session: Session, tmp_path: Path
) -> None:
    tenant = demo.seed(session=session, home=tmp_path)
    campaign = session.get(Campaign, tenant.campaign_id)
    assert campaign is not None
    assert campaign.data == {"link": "demo://orders/{{ order_id }}"}
    assert campaign.variables == ["first_name", "order_id"]
