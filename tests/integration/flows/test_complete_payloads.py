"""A campaign's complete payload through the whole stack (admin create-campaign ->
request -> flow run -> worker -> sandbox): what the sandbox received, field by field, under
the names Google (FCM HTTP v1 ``Message``) and Apple (``aps`` dictionary, request headers)
document; a per-user deep link arrives rendered; a payload over 4 KB is
``FPErrJSONMarshalling``; in-app entries carry the same data and expire with the TTL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from campaign_trigger.services import admin
from campaign_trigger.services.inbox import fetch_inbox
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Channel
from delivery_support import (
    DeviceSpec,
    Tenant,
    _create,
    add_devices,
    add_request,
    read_report,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]

TITLE = "Hello {{ first_name }}"
BODY = "Your code is ready"
LINK = "app://orders/{{ order_id }}"


def campaign_tenant(channel: Channel, **options: Any) -> Tenant:
    """An organisation, its Android and iOS apps, and a started campaign made by the
    admin service (what ``admin create-campaign`` calls)."""
    tag = uuid.uuid4().hex[:8]
    with session_scope() as session:
        org = admin.create_org(session=session, name=f"org-{tag}", quota=10**6)
        android = admin.create_app(
            session=session, org_name=org.name, app_id=f"and-{tag}", platform="android"
        )
        ios = admin.create_app(
            session=session, org_name=org.name, app_id=f"ios-{tag}", platform="ios"
        )
        campaign = admin.create_campaign(
            session=session,
            org_name=org.name,
            app_ids=[android.app_id, ios.app_id],
            channel=channel.value,
            title=options.pop("title", TITLE),
            body=options.pop("body", BODY),
            options=options,
        )
        assert sorted(campaign.variables) == ["first_name", "order_id"]
        admin.launch_campaign(session=session, campaign_id=campaign.id)
        assert org.id is not None
        return Tenant(org.id, campaign.id, android.app_id, ios.app_id, channel)


def audience(tenant: Tenant, users: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    names = [f"u{n}-{tag}" for n in range(users)]
    add_devices(
        [
            DeviceSpec(app, f"{user}-{app}", user, f"{user}-{app}")
            for user in names
            for app in tenant.app_ids
        ]
    )
    return names


async def deliver(tenant: Tenant, users: list[str]) -> dict[str, list[dict[str, str]]]:
    request_id = add_request(tenant, users, send_at=datetime.now(UTC))
    notify_new_request(request_id)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    return read_report(request_id)


def received(sandbox_url: str, token: str) -> dict[str, Any]:
    [delivery] = httpx.get(f"{sandbox_url}/sandbox/deliveries", params={"token": token}).json()
    assert isinstance(delivery, dict)
    return delivery


def without(document: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key not in names}


async def test_every_field_reaches_fcm_and_apns_under_their_documented_names(
    worker: None, sandbox_url: str
) -> None:
    tenant = campaign_tenant(
        Channel.push,
        data={"link": LINK, "screen": "order"},
        image="https://cdn.example.com/orders/{{ order_id }}.png",
        sound="chime.caf",
        badge=2,
        priority="normal",
        ttl_seconds=300,
        interruption_level="time-sensitive",
        thread_id="orders",
        category="ORDER_READY",
    )
    users = audience(tenant, 2)
    sent_at = time.time()
    report = await deliver(tenant, users)
    assert all(row["error_message"] == "" for rows in report.values() for row in rows)

    for n, user in enumerate(users):
        order = f"=O{n}"  # the order_id add_request gives the n-th user
        android = received(sandbox_url, f"{user}-{tenant.android}")["payload"]
        tag = android["android"]["notification"].pop("tag")
        assert len(tag) == 32  # the collapse identity
        assert without(android, "token", "data") == {
            "notification": {
                "title": f"Hello N{n}",
                "body": BODY,
                "image": f"https://cdn.example.com/orders/{order}.png",
            },
            "android": {
                "priority": "normal",
                "ttl": "300s",
                "notification": {
                    "sound": "chime.caf",
                    "notification_count": 2,
                    "click_action": "ORDER_READY",
                    "notification_priority": "PRIORITY_HIGH",
                },
            },
        }
        assert without(android["data"], "request_id", "campaign_id", "message_id") == {
            "link": f"app://orders/{order}",  # the per-user deep link, rendered
            "screen": "order",
        }
        assert android["data"]["campaign_id"] == tenant.campaign_id
        assert android["data"]["message_id"] == tag  # for the app to drop a second copy

        ios = received(sandbox_url, f"{user}-{tenant.ios}")
        assert (ios["push_type"], ios["priority"]) == ("alert", "5")
        assert sent_at + 290 <= int(ios["expiration"]) <= time.time() + 310
        assert ios["collapse_id"] == ios["payload"]["message_id"]
        assert without(ios["payload"], "request_id", "campaign_id", "message_id") == {
            "aps": {
                "alert": {"title": f"Hello N{n}", "body": BODY},
                "sound": "chime.caf",
                "badge": 2,
                "thread-id": "orders",
                "category": "ORDER_READY",
                "interruption-level": "time-sensitive",
                "mutable-content": 1,
            },
            "image": f"https://cdn.example.com/orders/{order}.png",
            "link": f"app://orders/{order}",
            "screen": "order",
        }


async def test_a_silent_push_is_a_background_push_and_a_data_only_message(
    worker: None, sandbox_url: str
) -> None:
    tenant = campaign_tenant(
        Channel.push,
        title="",
        body="",
        data={"sync": "orders", "link": LINK, "who": "{{ first_name }}"},
        silent=True,
        priority="normal",
    )
    [user] = audience(tenant, 1)
    await deliver(tenant, [user])

    android = received(sandbox_url, f"{user}-{tenant.android}")["payload"]
    assert "notification" not in android
    assert android["android"] == {"priority": "normal"}
    assert android["data"]["link"] == "app://orders/=O0"
    ios = received(sandbox_url, f"{user}-{tenant.ios}")
    assert (ios["push_type"], ios["priority"]) == ("background", "5")
    assert ios["payload"]["aps"] == {"content-available": 1}
    assert ios["payload"]["who"] == "N0"


async def test_a_payload_over_4_kb_is_fpe_json_marshalling_for_that_user_only(
    worker: None, sandbox_url: str
) -> None:
    tenant = campaign_tenant(Channel.push, data={"link": LINK})
    users = audience(tenant, 2)

    huge = "x" * 4100
    messages = [
        {"user_id": users[0], "template_variables": {"first_name": "A", "order_id": "1"}},
        {"user_id": users[1], "template_variables": {"first_name": "B", "order_id": huge}},
    ]
    request_id = _create(
        tenant,
        TriggerInput(campaign_id=tenant.campaign_id, messages=messages),
        chunk_size=None,
    )
    notify_new_request(request_id)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    for rows in read_report(request_id).values():
        outcomes = {row["user_id"]: row["error_message"] for row in rows}
        assert outcomes == {users[0]: "", users[1]: "FPErrJSONMarshalling"}


async def test_an_inapp_entry_carries_data_and_image_and_expires_with_the_ttl(
    worker: None,
) -> None:
    tenant = campaign_tenant(
        Channel.inapp,
        data={"link": LINK},
        image="https://cdn.example.com/{{ order_id }}.png",
        ttl_seconds=600,
    )
    [user] = audience(tenant, 1)
    await deliver(tenant, [user])

    with session_scope() as session:
        [entry], _ = fetch_inbox(
            session=session, app_id=tenant.ios, device_id=f"{user}-{tenant.ios}", user_id=user
        )
        assert entry.data == {"link": "app://orders/=O0"}
        assert entry.image == "https://cdn.example.com/=O0.png"
        assert entry.expires_at == entry.published_at + timedelta(seconds=600)
        later, _ = fetch_inbox(
            session=session,
            app_id=tenant.ios,
            device_id=f"{user}-{tenant.ios}",
            user_id=user,
            now=entry.published_at + timedelta(seconds=601),
        )
        assert later == []
