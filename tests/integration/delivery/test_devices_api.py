"""Device registry and inbox routes through a real HTTP server (uvicorn, create_app()):
app key, device secret, identity verification, inbox of the logged-in user."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import uvicorn
from sqlmodel import select

from campaign_trigger.api.app import create_app
from campaign_trigger.config import Settings
from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.providers import open_provider
from campaign_trigger.services import devices
from campaign_trigger.services.inbox import InboxEntry, publish_inapp
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import App, Device, Platform
from support import free_port


@pytest.fixture(scope="module")
def api(delivery_database: str) -> Iterator[str]:
    """The API served by uvicorn on a free port, in a thread."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "API did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def key(app: App, secret: str | None = None) -> dict[str, str]:
    headers = {"X-App-Key": app.sdk_key}
    if secret is not None:
        headers["X-Device-Secret"] = secret
    return headers


def register(
    api: str, app: App, device_id: str, token: str | None, secret: str | None = None
) -> httpx.Response:
    return httpx.post(
        f"{api}/api/apps/{app.app_id}/devices",
        json={"device_id": device_id, "push_token": token},
        headers=key(app, secret),
    )


def secret_of(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    secret = answer.json()["device_secret"]
    assert isinstance(secret, str)
    return secret


def test_a_device_registers_logs_in_and_out_opts_out_and_uninstalls(
    api: str, android_app: App
) -> None:
    created = register(api, android_app, "dev-1", "tok-1")
    assert created.status_code == 200
    secret = secret_of(created)
    assert created.headers["cache-control"] == "no-store"
    assert created.json() | {"updated_at": None, "device_secret": None} == {
        "app_id": android_app.app_id,
        "device_id": "dev-1",
        "user_id": None,
        "logged_in": False,
        "opted_in": True,
        "has_push_token": True,
        "unregistered": False,
        "uninstalled": False,
        "updated_at": None,
        "device_secret": None,
    }
    with session_scope() as session:
        stored = session.exec(
            select(Device).where(Device.app_id == android_app.app_id, Device.device_id == "dev-1")
        ).one()
        assert stored.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    base = f"{api}/api/apps/{android_app.app_id}/devices/dev-1"
    headers = key(android_app, secret)
    login = httpx.put(f"{base}/user", json={"user_id": "u-42"}, headers=headers)
    assert (login.json()["user_id"], login.json()["logged_in"]) == ("u-42", True)
    logout = httpx.delete(f"{base}/user", headers=headers)
    assert (logout.json()["user_id"], logout.json()["logged_in"]) == ("u-42", False)
    opt_out = httpx.put(f"{base}/push", json={"opted_in": False}, headers=headers)
    assert opt_out.json()["opted_in"] is False
    opt_in = httpx.put(f"{base}/push", json={"opted_in": True}, headers=headers)
    assert opt_in.json()["opted_in"] is True
    gone = httpx.post(f"{base}/uninstall", headers=headers)
    assert gone.json()["uninstalled"] is True
    back = register(api, android_app, "dev-1", "tok-2", secret)
    assert back.json()["uninstalled"] is False
    assert back.json()["device_secret"] is None  # shown once, at creation


def test_missing_wrong_and_other_apps_keys_are_refused(
    api: str, android_app: App, ios_app: App
) -> None:
    url = f"{api}/api/apps/{android_app.app_id}/devices"
    body = {"device_id": "dev-k", "push_token": "tok"}
    for headers in ({}, {"X-App-Key": "nope"}, key(ios_app)):
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 401
        assert set(answer.json()) == {"error_message"}
    secret = secret_of(register(api, android_app, "dev-k", "tok"))
    other = httpx.put(f"{url}/dev-k/push", json={"opted_in": False}, headers=key(ios_app, secret))
    assert other.status_code == 401
    inbox = httpx.get(
        f"{api}/api/inapp/messages",
        params={"device_id": "dev-k", "app_id": android_app.app_id},
        headers=key(ios_app, secret),
    )
    assert (inbox.status_code, set(inbox.json())) == (401, {"error_message"})


def test_bad_input_and_unknown_devices_answer_400_with_error_message(
    api: str, android_app: App
) -> None:
    empty = register(api, android_app, "", "tok")
    assert (empty.status_code, set(empty.json())) == (400, {"error_message"})
    secret = secret_of(register(api, android_app, "dev-c", "tok-c"))
    for cursor in (
        "garbage",
        "2026-01-01T00:00:00+00:00_99999999999999999999999",  # past a 64-bit integer
        "9999-12-31T23:59:59-23:00_1",  # no UTC equivalent
        "0001-01-01T00:00:00+23:00_1",
    ):
        answer = httpx.get(
            f"{api}/api/inapp/messages",
            params={"device_id": "dev-c", "cursor": cursor},
            headers=key(android_app, secret),
        )
        assert (answer.status_code, answer.json()) == (400, {"error_message": "Invalid cursor"})


async def test_unregistered_token_stays_unregistered_until_a_new_token_is_registered(
    api: str, android_app: App, settings: Settings
) -> None:
    secret = secret_of(register(api, android_app, "dev-u", "unregistered-dev-u"))
    provider = open_provider(Platform.android, settings=settings)
    try:
        [result] = await provider.send_many(
            [PushMessage(key=0, token="unregistered-dev-u", title="t", body="b", data={})]
        )
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrTokenUnregistered"
    assert result.unregistered_at is not None
    with session_scope() as session:  # what the delivery records with the answer
        devices.record_unregistered(
            session=session,
            app_id=android_app.app_id,
            tokens={"unregistered-dev-u": result.unregistered_at},
        )
    same = register(api, android_app, "dev-u", "unregistered-dev-u", secret)
    assert same.json()["unregistered"] is True  # the same token: still gone
    fresh = register(api, android_app, "dev-u", "brand-new-token", secret)
    assert fresh.json()["unregistered"] is False


def test_inbox_pages_newest_first_with_publish_time_as_sent_at(
    api: str, android_app: App, ios_app: App
) -> None:
    secrets_by_app = {}
    for app in (android_app, ios_app):
        secret = secret_of(register(api, app, "dev-i", f"tok-{app.app_id}"))
        login = httpx.put(
            f"{api}/api/apps/{app.app_id}/devices/dev-i/user",
            json={"user_id": "u1"},
            headers=key(app, secret),
        )
        assert login.status_code == 200, login.text
        secrets_by_app[app.app_id] = secret
    first = datetime(2026, 1, 1, tzinfo=UTC)
    entries = [
        InboxEntry(android_app.app_id, "dev-i", "u1", f"req-{n}", "camp", f"T{n}", f"B{n}")
        for n in range(130)
    ]
    others = [
        InboxEntry(android_app.app_id, "dev-other", "u2", "req-x", "camp", "X", "X"),
        InboxEntry(ios_app.app_id, "dev-i", "u1", "req-y", "camp", "Y", "Y"),
    ]
    with session_scope() as session:
        publish_inapp(session=session, rows=entries[:100], published_at=first)
        later = publish_inapp(session=session, rows=entries[100:] + others)
    assert later > first
    url = f"{api}/api/inapp/messages"
    android = key(android_app, secrets_by_app[android_app.app_id])
    page1 = httpx.get(url, params={"device_id": "dev-i", "limit": 100}, headers=android)
    assert page1.status_code == 200
    body1 = page1.json()
    assert [m["title"] for m in body1["messages"][:30]] == [f"T{n}" for n in range(129, 99, -1)]
    assert datetime.fromisoformat(body1["messages"][0]["sent_at"]) == later
    assert datetime.fromisoformat(body1["messages"][99]["sent_at"]) == first
    page2 = httpx.get(
        url,
        params={"device_id": "dev-i", "limit": 100, "cursor": body1["next_cursor"]},
        headers=android,
    ).json()
    titles = [m["title"] for m in body1["messages"] + page2["messages"]]
    assert titles == [f"T{n}" for n in range(129, -1, -1)]
    assert page2["next_cursor"] is None
    ios = key(ios_app, secrets_by_app[ios_app.app_id])
    ios_page = httpx.get(url, params={"device_id": "dev-i"}, headers=ios).json()
    assert [m["title"] for m in ios_page["messages"]] == ["Y"]


def test_publishing_thousands_of_inbox_rows_is_one_bulk_insert(android_app: App) -> None:
    rows = [
        InboxEntry(android_app.app_id, f"bulk-{n}", f"u{n}", "req-bulk", "camp", "T", "B")
        for n in range(5000)
    ]
    started = time.monotonic()
    with session_scope() as session:
        sent_at = publish_inapp(session=session, rows=rows)
    assert time.monotonic() - started < 5
    assert datetime.now(UTC) - sent_at < timedelta(seconds=10)


def test_inbox_entries_carry_data_and_image_and_expired_ones_are_left_out(
    api: str, android_app: App
) -> None:
    secret = secret_of(register(api, android_app, "dev-e", "tok-e"))
    headers = key(android_app, secret)
    login = httpx.put(
        f"{api}/api/apps/{android_app.app_id}/devices/dev-e/user",
        json={"user_id": "u-e"},
        headers=headers,
    )
    assert login.status_code == 200, login.text

    def entry(title: str) -> InboxEntry:
        return InboxEntry(
            android_app.app_id,
            "dev-e",
            "u-e",
            "req-e",
            "camp",
            title,
            "B",
            data={"link": f"app://orders/{title}"},
            image=f"https://cdn.example/{title}.png",
        )

    now = datetime.now(UTC)
    with session_scope() as session:
        earlier = now - timedelta(hours=2)  # its TTL of an hour has passed
        publish_inapp(session=session, rows=[entry("gone")], published_at=earlier, ttl_seconds=3600)
        publish_inapp(session=session, rows=[entry("kept")], published_at=now, ttl_seconds=3600)
        publish_inapp(session=session, rows=[entry("forever")], published_at=now)
    answer = httpx.get(f"{api}/api/inapp/messages", params={"device_id": "dev-e"}, headers=headers)
    assert answer.status_code == 200, answer.text
    shown = {m["title"]: m for m in answer.json()["messages"]}
    assert set(shown) == {"kept", "forever"}
    kept = shown["kept"]
    assert kept["data"] == {"link": "app://orders/kept"}
    assert kept["image"] == "https://cdn.example/kept.png"
    assert datetime.fromisoformat(kept["expires_at"]) == now + timedelta(hours=1)
    assert shown["forever"]["expires_at"] is None
