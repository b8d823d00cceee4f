"""Helpers of the API tests that act as an app SDK: register a device (keeping its
device secret), log a user in. Imported by name (``from api_devices import ...``)."""

from __future__ import annotations

from urllib.parse import quote

import httpx
from api_tenants import Tenant
from sqlmodel import select

from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import App


def tenant_app(tenant: Tenant) -> App:
    """The tenant's (only) app."""
    with session_scope() as session:
        return session.exec(select(App).where(App.org_id == tenant.org_id)).one()


def sdk_headers(app: App, secret: str | None = None) -> dict[str, str]:
    headers = {"X-App-Key": app.sdk_key}
    if secret is not None:
        headers["X-Device-Secret"] = secret
    return headers


def register(http: httpx.Client, app: App, device_id: str, push_token: str | None) -> str:
    """Register a new device; its device secret."""
    answer = http.post(
        f"/api/apps/{app.app_id}/devices",
        json={"device_id": device_id, "push_token": push_token},
        headers=sdk_headers(app),
    )
    assert answer.status_code == 200, answer.text
    secret = answer.json()["device_secret"]
    assert isinstance(secret, str)
    return secret


def log_in(
    http: httpx.Client,
    app: App,
    device_id: str,
    secret: str | None,
    user_id: str,
    identity_hash: str | None = None,
) -> httpx.Response:
    body: dict[str, str] = {"user_id": user_id}
    if identity_hash is not None:
        body["identity_hash"] = identity_hash
    return http.put(
        f"/api/apps/{app.app_id}/devices/{quote(device_id, safe='')}/user",
        json=body,
        headers=sdk_headers(app, secret),
    )
