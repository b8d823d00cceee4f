"""``admin create-campaign`` and ``update-campaign`` with a complete payload."""

from __future__ import annotations

import uuid

from admin_cli import admin

from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Campaign, PushPriority


def test_a_campaign_with_every_option_is_created_then_changed_while_draft() -> None:
    org, app_id = f"org-{uuid.uuid4().hex[:8]}", f"ios-{uuid.uuid4().hex[:8]}"
    assert admin("create-org", org)[0] == 0
    assert admin("create-app", "--org", org, "--app-id", app_id, "--platform", "ios")[0] == 0
    code, output = admin(
        "create-campaign",
        "--org", org, "--app-id", app_id, "--channel", "push",
        "--title", "Your code", "--body", "{{ code }}",
        "--data", "link=app://codes/{{ code_id }}", "--data", "kind=otp",
        "--image", "https://cdn.example/otp.png", "--sound", "otp.caf", "--badge", "1",
        "--priority", "high", "--ttl", "300", "--interruption-level", "time-sensitive",
        "--thread-id", "codes", "--category", "OTP",
    )  # fmt: skip
    assert code == 0, output
    assert "(variables: code, code_id)" in output
    campaign_id = output.strip().rsplit(": ", 1)[1]

    code, output = admin(
        "update-campaign", campaign_id, "--priority", "normal", "--sound", "", "--ttl", "120"
    )
    assert code == 0, output
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        assert campaign.data == {"link": "app://codes/{{ code_id }}", "kind": "otp"}
        assert (campaign.priority, campaign.sound, campaign.ttl_seconds) == (
            PushPriority.normal,
            None,
            120,
        )
        assert (campaign.badge, campaign.interruption_level, campaign.category) == (
            1,
            "time-sensitive",
            "OTP",
        )

    code, output = admin("update-campaign", campaign_id, "--data", "no-equals-sign")
    assert code == 1, output
    assert "KEY=TEMPLATE" in output
    code, output = admin("update-campaign", campaign_id, "--interruption-level", "loud")
    assert code == 1, output
    assert "Unknown interruption level" in output
    assert admin("launch-campaign", campaign_id)[0] == 0
    code, output = admin("update-campaign", campaign_id, "--badge", "3")
    assert code == 1, output
    assert "only a draft campaign can be changed" in output
