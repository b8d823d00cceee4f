"""Several organisations' apps, each with its own provider credentials, through the
whole stack (outbox -> flow run -> worker -> sandbox): every push signed with its own
app's key and addressed to its own project or topic; a rotation applies to the next
request without a restart; no secret in the logs."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest

from campaign_trigger.config import get_settings
from campaign_trigger.services import app_credentials
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from credentials_support import (
    ApnsKey,
    ServiceAccount,
    apns_key,
    secret_fragments,
    service_account,
)
from delivery_support import (
    DeviceSpec,
    Tenant,
    add_devices,
    add_request,
    read_report,
    seed_tenant,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]


@dataclass
class Customer:
    """An organisation with an Android and an iOS app, each with its own credentials."""

    tenant: Tenant
    account: ServiceAccount
    key: ApnsKey
    user: str

    @property
    def android_token(self) -> str:
        return f"{self.user}-android"

    @property
    def ios_token(self) -> str:
        return f"{self.user}-ios"


def give_fcm(app_id: str, account: ServiceAccount) -> None:
    with session_scope() as session:
        app_credentials.set_fcm_credentials(
            session=session,
            settings=get_settings(),
            app_id=app_id,
            service_account=account.file_bytes(),
        )


def give_apns(app_id: str, key: ApnsKey) -> None:
    with session_scope() as session:
        app_credentials.set_apns_credentials(
            session=session,
            settings=get_settings(),
            app_id=app_id,
            key=key.p8.encode(),
            key_id=key.key_id,
            team_id=key.team_id,
            topic=key.topic,
        )


def customer(sandbox_url: str, name: str) -> Customer:
    tenant = seed_tenant()
    tag = uuid.uuid4().hex[:6]
    account = service_account(f"{name}-{tag}")
    key = apns_key(f"com.{name}.app{tag}")
    account.register(sandbox_url)
    key.register(sandbox_url)
    give_fcm(tenant.android, account)
    give_apns(tenant.ios, key)
    user = f"{name}-{tag}"
    add_devices(
        [
            DeviceSpec(tenant.android, f"{user}-a", user, f"{user}-android"),
            DeviceSpec(tenant.ios, f"{user}-i", user, f"{user}-ios"),
        ]
    )
    return Customer(tenant, account, key, user)


def deliveries(sandbox_url: str, token: str) -> list[dict[str, object]]:
    answer = httpx.get(f"{sandbox_url}/sandbox/deliveries", params={"token": token})
    return list(answer.json())


async def send(*customers: Customer) -> list[str]:
    requests = [add_request(c.tenant, [c.user], send_at=datetime.now(UTC)) for c in customers]
    for request_id in requests:
        notify_new_request(request_id)
    for request_id in requests:
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
        assert state_name(run) == "COMPLETED", run.state
        for rows in read_report(request_id).values():
            assert [row["error_message"] for row in rows] == [""], rows
    return requests


async def test_each_app_sends_with_its_own_credentials_and_a_rotation_applies_at_once(
    worker: None, sandbox_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shop, bank = customer(sandbox_url, "shop"), customer(sandbox_url, "bank")

    await send(shop, bank)

    for c in (shop, bank):
        [android] = deliveries(sandbox_url, c.android_token)
        assert android["key_id"] == c.account.private_key_id
        assert android["client_email"] == c.account.client_email
        assert android["project"] == c.account.project_id
        [ios] = deliveries(sandbox_url, c.ios_token)
        assert ios["key_id"] == c.key.key_id
        assert ios["team_id"] == c.key.team_id
        assert ios["topic"] == c.key.topic

    # The shop rotates both keys (new ones made in Google's and Apple's consoles); the
    # worker keeps running, and the next request is signed with the new ones.
    new_account = ServiceAccount(
        project_id=shop.account.project_id,
        client_email=shop.account.client_email,
        private_key_id=service_account("x").private_key_id,
        private_key=service_account("x").private_key,
    )
    new_key = apns_key(shop.key.topic, team_id=shop.key.team_id)
    new_account.register(sandbox_url)
    new_key.register(sandbox_url)
    give_fcm(shop.tenant.android, new_account)
    give_apns(shop.tenant.ios, new_key)

    await send(shop, bank)

    to_android = deliveries(sandbox_url, shop.android_token)
    to_ios = deliveries(sandbox_url, shop.ios_token)
    assert [d["key_id"] for d in to_android] == [
        shop.account.private_key_id,
        new_account.private_key_id,
    ]
    assert [d["key_id"] for d in to_ios] == [shop.key.key_id, new_key.key_id]
    assert {d["key_id"] for d in deliveries(sandbox_url, bank.ios_token)} == {bank.key.key_id}

    secrets = [
        fragment
        for pem in (shop.account.private_key, shop.key.p8, bank.account.private_key, bank.key.p8)
        for fragment in secret_fragments(pem)
    ]
    logged = caplog.text
    assert logged  # the run was logged ...
    assert not [fragment for fragment in secrets if fragment in logged]  # ... without a key
