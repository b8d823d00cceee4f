"""Device registry and inbox routes through a real HTTP server (uvicorn, create_app())."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import uvicorn

from campaign_trigger.api.app import create_app
from campaign_trigger.config import Settings
from campaign_trigger.delivery import open_provider
from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.inapp import InboxEntry, publish_inapp
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import App, Platform


@pytest.fixture(scope="module")
def api(delivery_database: str) -> Iterator[str]:
    """The API served by uvicorn on a free port, in a thread."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
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


def key(app: App) -> dict[str, str]:
    return {"X-App-Key": app.sdk_key}


def register(api: str, app: App, device_id: str, token: str | None) -> httpx.Response:
    return httpx.post(
        f"{api}/api/apps/{app.app_id}/devices",
        json={"device_id": device_id, "push_token": token},
        headers=key(app),
    )


def test_a_device_registers_logs_in_and_out_opts_out_and_uninstalls(
    api: str, android_app: App
) -> None:
    created = register(api, android_app, "dev-1", "tok-1")
    assert created.status_code == 200
    assert created.json() | {"updated_at": None} == {
        "app_id": android_app.app_id,
        "device_id": "dev-1",
        "user_id": None,
        "logged_in": False,
        "opted_in": True,
        "has_push_token": True,
        "unregistered": False,
        "uninstalled": False,
        "updated_at": None,
    }
    base = f"{api}/api/apps/{android_app.app_id}/devices/dev-1"
    login = httpx.put(f"{base}/user", json={"user_id": "u-42"}, headers=key(android_app))
    assert (login.json()["user_id"], login.json()["logged_in"]) == ("u-42", True)
    logout = httpx.delete(f"{base}/user", headers=key(android_app))
    assert (logout.json()["user_id"], logout.json()["logged_in"]) == ("u-42", False)
    opt_out = httpx.put(f"{base}/push", json={"opted_in": False}, headers=key(android_app))
    assert opt_out.json()["opted_in"] is False
    opt_in = httpx.put(f"{base}/push", json={"opted_in": True}, headers=key(android_app))
    assert opt_in.json()["opted_in"] is True
    gone = httpx.post(f"{base}/uninstall", headers=key(android_app))
    assert gone.json()["uninstalled"] is True
    back = register(api, android_app, "dev-1", "tok-2")
    assert back.json()["uninstalled"] is False


def test_missing_wrong_and_other_apps_keys_are_refused(
    api: str, android_app: App, ios_app: App
) -> None:
    url = f"{api}/api/apps/{android_app.app_id}/devices"
    body = {"device_id": "dev-k", "push_token": "tok"}
    for headers in ({}, {"X-App-Key": "nope"}, key(ios_app)):
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 401
        assert set(answer.json()) == {"error_message"}
    assert register(api, android_app, "dev-k", "tok").status_code == 200
    other = httpx.put(f"{url}/dev-k/push", json={"opted_in": False}, headers=key(ios_app))
    assert other.status_code == 401
    inbox = httpx.get(
        f"{api}/api/inapp/messages",
        params={"device_id": "dev-k", "app_id": android_app.app_id},
        headers=key(ios_app),
    )
    assert (inbox.status_code, set(inbox.json())) == (401, {"error_message"})


def test_bad_input_and_unknown_devices_answer_400_with_error_message(
    api: str, android_app: App
) -> None:
    empty = register(api, android_app, "", "tok")
    assert (empty.status_code, set(empty.json())) == (400, {"error_message"})
    unknown = httpx.delete(
        f"{api}/api/apps/{android_app.app_id}/devices/never-seen/user", headers=key(android_app)
    )
    assert unknown.status_code == 400
    assert unknown.json() == {"error_message": "The device never-seen is not registered"}
    cursor = httpx.get(
        f"{api}/api/inapp/messages",
        params={"device_id": "d", "cursor": "garbage"},
        headers=key(android_app),
    )
    assert cursor.json() == {"error_message": "Invalid cursor"}


async def test_unregistered_token_stays_unregistered_until_a_new_token_is_registered(
    api: str, android_app: App, settings: Settings
) -> None:
    assert register(api, android_app, "dev-u", "unregistered-dev-u").status_code == 200
    provider = open_provider(Platform.android, settings=settings, app_id=android_app.app_id)
    try:
        [result] = await provider.send_many(
            [PushMessage(key=0, token="unregistered-dev-u", title="t", body="b", data={})]
        )
    finally:
        await provider.aclose()
    assert result.error_message == "FPErrTokenUnregistered"
    same = register(api, android_app, "dev-u", "unregistered-dev-u")
    assert same.json()["unregistered"] is True  # the same token: still gone
    fresh = register(api, android_app, "dev-u", "brand-new-token")
    assert fresh.json()["unregistered"] is False


def test_inbox_pages_newest_first_with_publish_time_as_sent_at(
    api: str, android_app: App, ios_app: App
) -> None:
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
    page1 = httpx.get(url, params={"device_id": "dev-i", "limit": 100}, headers=key(android_app))
    assert page1.status_code == 200
    body1 = page1.json()
    assert [m["title"] for m in body1["messages"][:30]] == [f"T{n}" for n in range(129, 99, -1)]
    assert datetime.fromisoformat(body1["messages"][0]["sent_at"]) == later
    assert datetime.fromisoformat(body1["messages"][99]["sent_at"]) == first
    page2 = httpx.get(
        url,
        params={"device_id": "dev-i", "limit": 100, "cursor": body1["next_cursor"]},
        headers=key(android_app),
    ).json()
    titles = [m["title"] for m in body1["messages"] + page2["messages"]]
    assert titles == [f"T{n}" for n in range(129, -1, -1)]
    assert page2["next_cursor"] is None
    ios_page = httpx.get(url, params={"device_id": "dev-i"}, headers=key(ios_app)).json()
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
