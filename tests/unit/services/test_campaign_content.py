"""A campaign's content: every template counts for its variables, options are checked
as the providers check them, and only a draft can change."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlmodel import Session

from campaign_trigger.config import Settings
from campaign_trigger.errors import AdminError, InvalidInput
from campaign_trigger.services import admin
from campaign_trigger.services.campaign_content import CampaignContent, check_content
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.files import Storage
from campaign_trigger.store.models import Campaign, PushPriority


@pytest.fixture
def org(session: Session) -> tuple[str, str]:
    name = f"org-{uuid.uuid4().hex[:6]}"
    admin.create_org(session=session, name=name, quota=100)
    app = admin.create_app(session=session, org_name=name, app_id=f"a-{name}", platform="ios")
    return name, app.app_id


def test_variables_of_every_template_are_required(
    session: Session, settings: Settings, storage: Storage, org: tuple[str, str]
) -> None:
    name, app_id = org
    campaign = admin.create_campaign(
        session=session,
        org_name=name,
        app_ids=[app_id],
        channel="push",
        title="Hi {{ first_name }}",
        body="Your order",
        options={
            "data": {"link": "app://orders/{{ order_id }}", "kind": "{{ kind }}"},
            "image": "https://cdn.example/{{ sku }}.png",
        },
    )
    assert campaign.variables == ["first_name", "order_id", "kind", "sku"]
    admin.launch_campaign(session=session, campaign_id=campaign.id)
    session.commit()
    with pytest.raises(InvalidInput) as refused:
        create_request(
            session=session,
            settings=settings,
            storage=storage,
            org_id=campaign.org_id,
            request_id="r1",
            trigger=TriggerInput(
                campaign_id=campaign.id,
                messages=[{"user_id": "u", "template_variables": {"first_name": "A"}}],
            ),
        )
    assert refused.value.message == "Invalid file : missing variables : (order_id, kind, sku)"


def _titled(
    session: Session, org: tuple[str, str], channel: str, options: dict[str, Any]
) -> Campaign:
    """A campaign of the org's app titled "t", with ``options``."""
    name, app_id = org
    return admin.create_campaign(
        session=session,
        org_name=name,
        app_ids=[app_id],
        channel=channel,
        title="t",
        body="",
        options=options,
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (CampaignContent(title="t", data={"request_id": "x"}), "reserved"),
        (CampaignContent(title="t", data={"message_id": "x"}), "reserved"),
        (CampaignContent(title="t", data={"google.c.a": "x"}), "reserved"),
        (CampaignContent(title="t", data={"image": "x"}), "reserved"),
        (CampaignContent(title="t", data={"a b": "x"}), "Invalid data key"),
        (CampaignContent(title="t", image="http://x/y.png"), "https://"),
        (CampaignContent(title="t", badge=-1), "badge"),
        (CampaignContent(title="t", priority="urgent"), "Unknown priority"),
        (CampaignContent(title="t", ttl_seconds=29 * 24 * 3600), "TTL"),
        (CampaignContent(title="t", interruption_level="loud"), "interruption level"),
        (CampaignContent(title="t", sound=" "), "sound"),
        (CampaignContent(title="t", data={"k": "{{ a.b }}"}), "Unsupported template"),
        (CampaignContent(title="t", silent=True, data={"k": "v"}), "silent push shows nothing"),
        (CampaignContent(silent=True), "needs --data"),
        (CampaignContent(), "title or a body"),
    ],
)
def test_content_a_provider_would_refuse_is_refused(content: CampaignContent, reason: str) -> None:
    with pytest.raises(AdminError, match=reason):
        check_content(content)


def test_only_a_draft_changes_and_an_empty_value_clears(
    session: Session, org: tuple[str, str]
) -> None:
    name, app_id = org
    campaign = admin.create_campaign(
        session=session,
        org_name=name,
        app_ids=[app_id],
        channel="push",
        title="Code {{ code }}",
        body="",
        options={"sound": "chime.caf", "ttl_seconds": 300},
    )
    admin.update_campaign(
        session=session,
        campaign_id=campaign.id,
        changes={"sound": "", "priority": "normal", "data": {"link": "app://c/{{ code }}"}},
    )
    assert (campaign.sound, campaign.priority, campaign.ttl_seconds) == (
        None,
        PushPriority.normal,
        300,
    )
    assert campaign.data == {"link": "app://c/{{ code }}"}
    with pytest.raises(AdminError, match="https://"):
        admin.update_campaign(session=session, campaign_id=campaign.id, changes={"image": "x"})
    assert campaign.image is None  # a refused change changes nothing
    admin.launch_campaign(session=session, campaign_id=campaign.id)
    with pytest.raises(AdminError, match="only a draft"):
        admin.update_campaign(session=session, campaign_id=campaign.id, changes={"badge": 1})
    with pytest.raises(AdminError, match="in-app campaign has no silent"):
        _titled(session, org, "inapp", {"silent": True, "data": {"k": "v"}})


def test_an_inapp_campaign_takes_data_image_and_ttl_but_no_push_options(
    session: Session, org: tuple[str, str]
) -> None:
    name, app_id = org
    campaign = admin.create_campaign(
        session=session,
        org_name=name,
        app_ids=[app_id],
        channel="inapp",
        title="Order {{ order_id }}",
        body="",
        options={"data": {"link": "app://o/{{ order_id }}"}, "ttl_seconds": 60},
    )
    with pytest.raises(AdminError, match="in-app campaign has no sound, badge"):
        admin.update_campaign(
            session=session, campaign_id=campaign.id, changes={"sound": "a.caf", "badge": 1}
        )


def test_an_inapp_campaign_with_a_ttl_of_0_is_refused(
    session: Session, org: tuple[str, str]
) -> None:
    """Its inbox entries would expire as they are published: never shown, reported sent."""
    with pytest.raises(AdminError) as refused:
        _titled(session, org, "inapp", {"ttl_seconds": 0})
    assert refused.value.message == (
        "An in-app campaign's TTL must be at least 1 second: "
        "its messages expire as they are published (none would be shown)"
    )
    campaign = _titled(session, org, "inapp", {"ttl_seconds": 1})
    with pytest.raises(AdminError, match="at least 1 second"):
        admin.update_campaign(session=session, campaign_id=campaign.id, changes={"ttl_seconds": 0})
    assert campaign.ttl_seconds == 1
    # a push's TTL 0 is one attempt, now or never
    pushed = _titled(session, org, "push", {"ttl_seconds": 0})
    assert pushed.ttl_seconds == 0
