"""``admin add-webhook``, ``list-webhooks``, ``remove-webhook`` and ``webhook-attempts``:
the secret printed once and stored sealed, the https rule, refusals as one line."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from admin_cli import ok, refused
from sqlmodel import select

from campaign_trigger.config import get_settings
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import WebhookEndpoint


@pytest.fixture
def org(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh organisation; settings outside sandbox mode (whatever suite set it)."""
    monkeypatch.delenv("CT_SEND_TO_SANDBOX", raising=False)
    get_settings.cache_clear()
    name = f"org-{uuid.uuid4().hex[:8]}"
    ok("create-org", name)
    yield name
    get_settings.cache_clear()


def test_a_webhook_is_added_listed_and_removed(org: str) -> None:
    said = ok("add-webhook", "--org", org, "https://hooks.example.com/ct")
    match = re.search(r"Registered webhook (whk_\w+) for https://hooks.example.com/ct\n", said)
    assert match, said
    endpoint_id = match.group(1)
    secret = re.search(r"Signing secret \(shown once\): (whsec_\S+)", said)
    assert secret, said
    with session_scope() as session:
        stored = session.exec(select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id))
        assert secret.group(1) not in stored.one().sealed_secret
    listed = ok("list-webhooks", "--org", org)
    assert listed.startswith(f"{endpoint_id}  https://hooks.example.com/ct  (since ")
    assert secret.group(1) not in listed
    assert ok("webhook-attempts", "--org", org, endpoint_id) == (
        f"No attempts yet for {endpoint_id}.\n"
    )
    assert ok("remove-webhook", "--org", org, endpoint_id) == f"Removed webhook {endpoint_id}.\n"
    assert ok("list-webhooks", "--org", org) == f"No webhooks for {org}.\n"


def test_refusals_are_one_line_and_change_nothing(org: str) -> None:
    assert refused("add-webhook", "--org", org, "http://hooks.example.com/ct") == (
        "error: The webhook URL must be an https:// URL"
    )
    assert refused("add-webhook", "--org", "no-such-org", "https://h.example.com") == (
        "error: Unknown organisation 'no-such-org'"
    )
    assert refused("remove-webhook", "--org", org, "whk_nope") == (
        "error: The webhook whk_nope was not found"
    )
    assert ok("list-webhooks", "--org", org) == f"No webhooks for {org}.\n"
