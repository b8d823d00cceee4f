"""Impersonation through the real server: the app's SDK key (shipped in every copy of
the app) is not enough to act on another install or to log in another user. Device
secrets guard every call about a device; identity verification, turned on with the
admin CLI, guards logins; the inbox shows the logged-in user's messages only."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from api_devices import log_in, register, sdk_headers, tenant_app
from api_tenants import Server, Tenant
from sqlmodel import select

from campaign_trigger.services.inbox import InboxEntry, publish_inapp
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import App, Device
from support import VENV_BIN

UNKNOWN_DEVICE = {"error_message": "Unknown device or wrong device secret"}


@pytest.fixture
def http(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


def admin(*args: str) -> str:
    """``campaign-trigger admin ...`` as an operator runs it (a real process)."""
    done = subprocess.run(
        [str(VENV_BIN / "campaign-trigger"), "admin", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def identity_key(app: App) -> str:
    shown = admin("show-identity-key", "--app-id", app.app_id)
    return shown.split("Identity key: ", 1)[1].strip()


def vouch(key: str, user_id: str) -> str:
    """What the tenant's back-end computes for its signed-in user."""
    return hmac.new(key.encode(), user_id.encode(), hashlib.sha256).hexdigest()


def inbox(http: httpx.Client, app: App, device_id: str, secret: str | None) -> httpx.Response:
    return http.get(
        "/api/inapp/messages", params={"device_id": device_id}, headers=sdk_headers(app, secret)
    )


def _device(app: App, device_id: str) -> Device:
    with session_scope() as session:
        return session.exec(
            select(Device).where(Device.app_id == app.app_id, Device.device_id == device_id)
        ).one()


def test_an_attacker_device_cannot_log_in_the_victim_nor_read_the_victims_inbox(
    http: httpx.Client, tenant: Tenant
) -> None:
    app = tenant_app(tenant)
    assert "identity verification on" in admin(
        "set-identity-verification", "--app-id", app.app_id, "--on"
    )
    key = identity_key(app)
    victim_secret = register(http, app, "victim-phone", "victim-token")
    logged = log_in(http, app, "victim-phone", victim_secret, "victim", vouch(key, "victim"))
    assert logged.status_code == 200, logged.text
    with session_scope() as session:  # the in-app delivery publishes a one-time code
        publish_inapp(
            session=session,
            rows=[InboxEntry(app.app_id, "victim-phone", "victim", "r1", "c1", "Code", "424242")],
        )
    assert [
        m["body"] for m in inbox(http, app, "victim-phone", victim_secret).json()["messages"]
    ] == ["424242"]

    # The attacker holds the SDK key (it ships with the app) and registers its own device.
    attacker_secret = register(http, app, "attacker-phone", "attacker-token")
    for proof in (None, vouch("a guessed key", "victim"), vouch(key, "attacker"), "0" * 64):
        refused = log_in(http, app, "attacker-phone", attacker_secret, "victim", proof)
        assert refused.status_code == 401, refused.text
        assert set(refused.json()) == {"error_message"}
    own = inbox(http, app, "attacker-phone", attacker_secret)
    assert own.json() == {"messages": [], "next_cursor": None}
    for secret in (None, attacker_secret, "ds_guess"):
        stolen = inbox(http, app, "victim-phone", secret)
        assert (stolen.status_code, stolen.json()) == (401, UNKNOWN_DEVICE)
    # ... nor take the victim's device over, nor act on it
    again = http.post(
        f"/api/apps/{app.app_id}/devices",
        json={"device_id": "victim-phone", "push_token": "attacker-token"},
        headers=sdk_headers(app),
    )
    assert again.status_code == 409
    assert "already registered" in again.json()["error_message"]
    base = f"/api/apps/{app.app_id}/devices/victim-phone"
    with_attacker_secret = sdk_headers(app, attacker_secret)
    for answer in (
        http.post(
            f"/api/apps/{app.app_id}/devices",
            json={"device_id": "victim-phone", "push_token": "x"},
            headers=with_attacker_secret,
        ),
        http.delete(f"{base}/user", headers=with_attacker_secret),
        http.put(f"{base}/push", json={"opted_in": False}, headers=with_attacker_secret),
        http.post(f"{base}/uninstall", headers=with_attacker_secret),
        log_in(http, app, "victim-phone", attacker_secret, "attacker"),
    ):
        assert (answer.status_code, answer.json()) == (401, UNKNOWN_DEVICE)
    victim = _device(app, "victim-phone")
    assert (victim.user_id, victim.logged_in, victim.opted_in) == ("victim", True, True)
    assert (victim.push_token, victim.uninstalled_at) == ("victim-token", None)


def test_rotating_the_identity_key_voids_the_old_hashes(http: httpx.Client, tenant: Tenant) -> None:
    app = tenant_app(tenant)
    admin("set-identity-verification", "--app-id", app.app_id, "--on")
    old = identity_key(app)
    rotated = admin("rotate-identity-key", "--app-id", app.app_id)
    new = rotated.split("Identity key: ", 1)[1].strip()
    assert new != old
    assert identity_key(app) == new
    secret = register(http, app, "phone", "token")
    assert log_in(http, app, "phone", secret, "ada", vouch(old, "ada")).status_code == 401
    assert log_in(http, app, "phone", secret, "ada", vouch(new, "ada").upper()).status_code == 200
    admin("set-identity-verification", "--app-id", app.app_id, "--off")
    assert log_in(http, app, "phone", secret, "grace").status_code == 200


def test_the_inbox_shows_the_user_logged_in_now(http: httpx.Client, tenant: Tenant) -> None:
    app = tenant_app(tenant)
    secret = register(http, app, "shared-tablet", "tablet-token")
    with session_scope() as session:
        publish_inapp(
            session=session,
            rows=[
                InboxEntry(app.app_id, "shared-tablet", "ada", "r", "c", "For Ada", "a"),
                InboxEntry(app.app_id, "shared-tablet", "alan", "r", "c", "For Alan", "b"),
            ],
        )
    assert inbox(http, app, "shared-tablet", secret).json()["messages"] == []  # nobody in
    assert log_in(http, app, "shared-tablet", secret, "ada").status_code == 200
    titles = [m["title"] for m in inbox(http, app, "shared-tablet", secret).json()["messages"]]
    assert titles == ["For Ada"]
    assert log_in(http, app, "shared-tablet", secret, "alan").status_code == 200
    titles = [m["title"] for m in inbox(http, app, "shared-tablet", secret).json()["messages"]]
    assert titles == ["For Alan"]
    logout = http.delete(
        f"/api/apps/{app.app_id}/devices/shared-tablet/user", headers=sdk_headers(app, secret)
    )
    assert logout.status_code == 200
    assert inbox(http, app, "shared-tablet", secret).json()["messages"] == []


def test_an_imported_device_is_claimed_by_its_own_push_token(
    http: httpx.Client, tenant: Tenant
) -> None:
    app = tenant_app(tenant)
    with session_scope() as session:  # as `admin import-devices` leaves it: no secret
        session.add(Device(app_id=app.app_id, device_id="imported", user_id="u", push_token="t1"))
    url = f"/api/apps/{app.app_id}/devices"
    guessed = http.post(
        url, json={"device_id": "imported", "push_token": "t2"}, headers=sdk_headers(app)
    )
    assert guessed.status_code == 409
    claimed = http.post(
        url, json={"device_id": "imported", "push_token": "t1"}, headers=sdk_headers(app)
    )
    assert claimed.status_code == 200, claimed.text
    secret = claimed.json()["device_secret"]
    assert secret.startswith("ds_")
    assert (claimed.json()["user_id"], claimed.json()["logged_in"]) == ("u", True)
    twice = http.post(
        url, json={"device_id": "imported", "push_token": "t1"}, headers=sdk_headers(app)
    )
    assert twice.status_code == 409  # claimed once: its secret is needed from now on
    assert inbox(http, app, "imported", secret).status_code == 200


def test_a_device_id_with_a_slash_is_refused(http: httpx.Client, tenant: Tenant) -> None:
    app = tenant_app(tenant)
    answer = http.post(
        f"/api/apps/{app.app_id}/devices",
        json={"device_id": "a/b", "push_token": "t"},
        headers=sdk_headers(app),
    )
    assert answer.status_code == 400
    assert "device_id" in answer.json()["error_message"]
