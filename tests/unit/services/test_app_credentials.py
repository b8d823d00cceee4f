"""Apps' own provider credentials: checked when set, sealed in the database, shown
without a secret, resolved for sending (with the fallbacks), refused in production."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import text
from sqlmodel import Session

from campaign_trigger.config import Settings
from campaign_trigger.delivery.credentials import (
    APNS_DEVELOPMENT_HOST,
    APNS_HOST,
    FCM_HOST,
    GLOBAL,
    ApnsCredentials,
    FcmCredentials,
)
from campaign_trigger.errors import AdminError
from campaign_trigger.services import app_credentials
from campaign_trigger.services.requests import create_request
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.files import Storage
from campaign_trigger.store.models import App, AppCredentials, CampaignApp, Platform
from credentials_support import apns_key, secret_fragments, service_account
from service_support import Org


def _ios_app(session: Session, org: Org) -> str:
    app_id = f"{org.app_id}-ios"
    session.add(App(app_id=app_id, org_id=org.org_id, platform=Platform.ios, sdk_key=app_id))
    session.add(CampaignApp(campaign_id=org.campaign_id, app_id=app_id))
    session.commit()
    return app_id


def test_a_service_account_is_stored_sealed_and_sent_with_to_its_project(
    session: Session, settings: Settings, org: Org
) -> None:
    account = service_account("shop-one")
    row = app_credentials.set_fcm_credentials(
        session=session, settings=settings, app_id=org.app_id, service_account=account.file_bytes()
    )
    session.commit()

    assert (row.project_id, row.client_email, row.version) == ("shop-one", account.client_email, 1)
    stored = session.execute(text("SELECT * FROM appcredentials")).all()
    dump = repr(stored)
    assert all(fragment not in dump for fragment in secret_fragments(account.private_key))
    credentials = app_credentials.provider_credentials(
        session=session, settings=settings, app_id=org.app_id, platform=Platform.android
    )
    assert isinstance(credentials, FcmCredentials)
    assert credentials.project_id == "shop-one"
    assert credentials.private_key_id == account.private_key_id
    assert credentials.base_url == FCM_HOST  # its own credentials go to Google
    assert credentials.identity.startswith(f"app:{org.app_id}:v1:")
    assert account.private_key not in repr(credentials)
    shown = app_credentials.describe_app(session=session, settings=settings, app_id=org.app_id)
    assert shown["project_id"] == "shop-one"
    assert all(fragment not in repr(shown) for fragment in secret_fragments(account.private_key))


def test_credentials_removed_and_set_again_are_new_to_the_provider_pool(
    session: Session, settings: Settings, org: Org
) -> None:
    # Set, removed, set again: a version 1 both times. A worker's pooled provider is
    # opened again when the identity changes; with the version alone it kept the removed
    # credentials (a wrong topic, a revoked key) until the worker restarted.
    identities = []
    for project in ("wrong-project", "right-project"):
        app_credentials.set_fcm_credentials(
            session=session,
            settings=settings,
            app_id=org.app_id,
            service_account=service_account(project).file_bytes(),
        )
        session.commit()
        credentials = app_credentials.provider_credentials(
            session=session, settings=settings, app_id=org.app_id, platform=Platform.android
        )
        assert credentials is not None
        identities.append(credentials.identity)
        again = app_credentials.provider_credentials(
            session=session, settings=settings, app_id=org.app_id, platform=Platform.android
        )
        assert again is not None
        assert again.identity == credentials.identity  # read twice: the same provider
        assert app_credentials.remove_credentials(session=session, app_id=org.app_id)
        session.commit()
    assert identities[0].startswith(f"app:{org.app_id}:v1:")
    assert identities[1].startswith(f"app:{org.app_id}:v1:")
    assert identities[0] != identities[1]


def test_an_apns_key_picks_its_environment_and_a_new_key_is_a_new_version(
    session: Session, settings: Settings, org: Org
) -> None:
    ios = _ios_app(session, org)
    first, second = apns_key("com.shop.one"), apns_key("com.shop.one")
    for key, development in ((first, True), (second, False)):
        app_credentials.set_apns_credentials(
            session=session,
            settings=settings,
            app_id=ios,
            key=key.p8.encode(),
            key_id=key.key_id,
            team_id=key.team_id,
            topic=key.topic,
            development=development,
        )
        session.commit()
        credentials = app_credentials.provider_credentials(
            session=session, settings=settings, app_id=ios, platform=Platform.ios
        )
        assert isinstance(credentials, ApnsCredentials)
        assert credentials.key_id == key.key_id
        assert credentials.topic == "com.shop.one"
        assert credentials.base_url == (APNS_DEVELOPMENT_HOST if development else APNS_HOST)
    assert credentials is not None
    assert credentials.identity.startswith(f"app:{ios}:v2:")
    to_sandbox = settings.model_copy(update={"send_to_sandbox": True})
    credentials = app_credentials.provider_credentials(
        session=session, settings=to_sandbox, app_id=ios, platform=Platform.ios
    )
    assert credentials is not None
    assert credentials.base_url == settings.apns_base_url


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"type": "authorized_user"}, "not a service-account key"),
        ({"project_id": ""}, "no project_id"),
        ({"private_key": "not a key"}, "not a PEM private key"),
        ({"client_email": "nobody"}, "not an e-mail address"),
    ],
)
def test_an_unusable_service_account_is_refused_with_its_reason(
    session: Session, settings: Settings, org: Org, change: dict[str, str], reason: str
) -> None:
    document = json.loads(service_account("p").file_bytes())
    document.update(change)
    with pytest.raises(AdminError, match=reason):
        app_credentials.set_fcm_credentials(
            session=session,
            settings=settings,
            app_id=org.app_id,
            service_account=json.dumps(document).encode(),
        )


def test_keys_of_the_wrong_kind_or_platform_are_refused(
    session: Session, settings: Settings, org: Org
) -> None:
    ios = _ios_app(session, org)
    key = apns_key("com.shop.one")
    account = service_account("p")

    def set_apns(app_id: str, **change: str) -> None:
        fields: dict[str, Any] = {
            "key_id": key.key_id,
            "team_id": key.team_id,
            "topic": key.topic,
        } | change
        app_credentials.set_apns_credentials(
            session=session, settings=settings, app_id=app_id, key=key.p8.encode(), **fields
        )

    with pytest.raises(AdminError, match="is an Android app"):
        set_apns(org.app_id)
    with pytest.raises(AdminError, match="is an iOS app"):
        app_credentials.set_fcm_credentials(
            session=session, settings=settings, app_id=ios, service_account=account.file_bytes()
        )
    with pytest.raises(AdminError, match="EC P-256"):
        app_credentials.set_apns_credentials(
            session=session,
            settings=settings,
            app_id=ios,
            key=account.private_key.encode(),  # an RSA key
            key_id=key.key_id,
            team_id=key.team_id,
            topic=key.topic,
        )
    with pytest.raises(AdminError, match="Invalid topic"):
        set_apns(ios, topic="no spaces allowed")
    with pytest.raises(AdminError, match="Invalid key id"):
        set_apns(ios, key_id="")
    with pytest.raises(AdminError, match="Unknown app"):
        set_apns("nope")


def test_production_refuses_a_push_request_for_an_app_without_credentials(
    session: Session, settings: Settings, storage: Storage, org: Org
) -> None:
    production = settings.model_copy(update={"require_app_credentials": True})
    trigger = TriggerInput(
        campaign_id=org.campaign_id,
        messages=[{"user_id": "u1", "template_variables": {"first_name": "A", "code": "1"}}],
    )

    with pytest.raises(app_credentials.MissingCredentials) as refused:
        create_request(
            session=session,
            settings=production,
            storage=storage,
            org_id=org.org_id,
            request_id="r-refused",
            trigger=trigger,
        )
    assert refused.value.message.startswith(f"App {org.app_id} has no push provider credentials")
    assert (
        app_credentials.provider_credentials(
            session=session, settings=production, app_id=org.app_id, platform=Platform.android
        )
        is None
    )
    shown = app_credentials.describe_app(session=session, settings=production, app_id=org.app_id)
    assert "refused" in shown["credentials"]

    app_credentials.set_fcm_credentials(
        session=session,
        settings=production,
        app_id=org.app_id,
        service_account=service_account("p").file_bytes(),
    )
    session.commit()
    created = create_request(
        session=session,
        settings=production,
        storage=storage,
        org_id=org.org_id,
        request_id="r-accepted",
        trigger=trigger,
    )
    assert created == "r-accepted"


def test_development_falls_back_to_the_global_credentials(
    session: Session, settings: Settings, org: Org
) -> None:
    credentials = app_credentials.provider_credentials(
        session=session, settings=settings, app_id=org.app_id, platform=Platform.android
    )
    assert isinstance(credentials, FcmCredentials)
    assert credentials.identity == GLOBAL
    shown = app_credentials.describe_app(session=session, settings=settings, app_id=org.app_id)
    assert shown["credentials"] == "none: pushes go to the sandbox"


def test_credentials_that_do_not_open_are_not_used(
    session: Session, settings: Settings, org: Org
) -> None:
    app_credentials.set_fcm_credentials(
        session=session,
        settings=settings,
        app_id=org.app_id,
        service_account=service_account("p").file_bytes(),
    )
    session.commit()
    other_secret = settings.model_copy(update={"secret_key": SecretStr("z" * 40)})
    assert (
        app_credentials.provider_credentials(
            session=session, settings=other_secret, app_id=org.app_id, platform=Platform.android
        )
        is None
    )
    assert app_credentials.remove_credentials(session=session, app_id=org.app_id)
    assert session.get(AppCredentials, org.app_id) is None
