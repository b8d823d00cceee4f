"""Several apps' own keys side by side in the sandbox, sent with by our real clients: each
push is checked against the key that signed it, and a key bound to its project or bundle
id cannot send to another one (as Google and Apple refuse it)."""

from __future__ import annotations

import dataclasses

import httpx
from push_helpers import message

from campaign_trigger.config import Settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.credentials import (
    ApnsCredentials,
    app_apns_credentials,
    app_fcm_credentials,
    parse_service_account,
)
from campaign_trigger.delivery.fcm import FcmProvider
from credentials_support import ApnsKey, apns_key, service_account


def _to_sandbox(settings: Settings) -> Settings:
    return settings.model_copy(update={"send_to_sandbox": True})


async def test_two_apps_fcm_keys_each_send_to_their_own_project_only(
    sandbox: str, settings: Settings
) -> None:
    settings = _to_sandbox(settings)
    one, two = service_account("tenant-one"), service_account("tenant-two")
    for account in (one, two):
        account.register(sandbox)
    providers = [
        FcmProvider(
            app_fcm_credentials(
                settings,
                service_account=parse_service_account(account.file_bytes()),
                identity=account.project_id,
            )
        )
        for account in (one, two)
    ]
    try:
        for provider, account in zip(providers, (one, two), strict=True):
            [result] = await provider.send_many([message(0, f"tok-{account.project_id}")])
            assert result.error_message == ""
        # A service account sending to another project: PERMISSION_DENIED, the app flagged.
        stray = parse_service_account(one.file_bytes()) | {"project_id": "tenant-two"}
        wrong = FcmProvider(app_fcm_credentials(settings, service_account=stray, identity="x"))
        [result] = await wrong.send_many([message(0, "tok-stray")])
        await wrong.aclose()
    finally:
        for provider in providers:
            await provider.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert wrong.auth_failed
    for account in (one, two):
        [delivery] = httpx.get(
            f"{sandbox}/sandbox/deliveries", params={"token": f"tok-{account.project_id}"}
        ).json()
        assert delivery["project"] == account.project_id
        assert delivery["key_id"] == account.private_key_id
        assert delivery["client_email"] == account.client_email
    assert httpx.get(f"{sandbox}/sandbox/deliveries", params={"token": "tok-stray"}).json() == []


async def test_two_apps_apns_keys_each_push_to_their_own_topic_only(
    sandbox: str, settings: Settings
) -> None:
    settings = _to_sandbox(settings)
    one, two = apns_key("com.one.app"), apns_key("com.two.app")
    for key in (one, two):
        key.register(sandbox)

    def credentials(key: ApnsKey, **change: str) -> ApnsCredentials:
        fields = dataclasses.asdict(key) | change
        return app_apns_credentials(
            settings,
            private_key=fields["p8"],
            key_id=fields["key_id"],
            team_id=fields["team_id"],
            topic=fields["topic"],
            development=False,
            identity=fields["key_id"],
        )

    for key in (one, two):
        provider = ApnsProvider(credentials(key))
        [result] = await provider.send_many([message(0, f"tok-{key.topic}")])
        await provider.aclose()
        assert result.error_message == ""
        [delivery] = httpx.get(
            f"{sandbox}/sandbox/deliveries", params={"token": f"tok-{key.topic}"}
        ).json()
        assert (delivery["key_id"], delivery["team_id"], delivery["topic"]) == (
            key.key_id,
            key.team_id,
            key.topic,
        )
    # One team's key pushing to the other team's app: TopicDisallowed, the app flagged.
    stray = ApnsProvider(credentials(one, topic="com.two.app"))
    [result] = await stray.send_many([message(0, "tok-stray")])
    await stray.aclose()
    assert result.error_message == "FPErrPushFailed"
    assert stray.auth_failed
