"""Production mode through the API: a push request for an app without provider
credentials is a 400 naming the app, in the contract's error format; in-app requests
need none; once the app has credentials the same call is accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from api_tenants import Tenant
from sqlmodel import select

from campaign_trigger.api.app import create_app
from campaign_trigger.config import get_settings
from campaign_trigger.services import app_credentials
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import CampaignApp
from credentials_support import service_account

TRIGGER = "/api/campaigns/trigger"


@pytest.fixture
async def production() -> AsyncIterator[httpx.AsyncClient]:
    """The API in process with CT_REQUIRE_APP_CREDENTIALS on."""
    app = create_app()
    settings = get_settings().model_copy(update={"require_app_credentials": True})
    app.dependency_overrides[get_settings] = lambda: settings
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def test_a_push_request_for_an_app_without_credentials_is_refused_by_name(
    production: httpx.AsyncClient, tenant: Tenant
) -> None:
    with session_scope() as session:
        app_id = session.exec(
            select(CampaignApp.app_id).where(CampaignApp.campaign_id == tenant.plain)
        ).one()
    body = {"campaign_id": tenant.plain, "messages": [{"user_id": "u1"}]}

    refused = await production.post(TRIGGER, json=body, headers=tenant.auth())
    assert refused.status_code == 400
    assert refused.json() == {
        "error_message": f"App {app_id} has no push provider credentials: set them with "
        "campaign-trigger admin set-credentials"
    }
    inapp = {
        "campaign_id": tenant.inapp,
        "messages": [{"user_id": "u1", "template_variables": {"first_name": "A"}}],
    }
    assert (await production.post(TRIGGER, json=inapp, headers=tenant.auth())).status_code == 200

    with session_scope() as session:
        app_credentials.set_fcm_credentials(
            session=session,
            settings=get_settings(),
            app_id=app_id,
            service_account=service_account("prod-project").file_bytes(),
        )
    accepted = await production.post(TRIGGER, json=body, headers=tenant.auth())
    assert accepted.status_code == 200, accepted.text
    assert set(accepted.json()) == {"request_id"}
