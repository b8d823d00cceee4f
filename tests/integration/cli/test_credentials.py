"""``admin set-credentials``, ``show-app`` and ``remove-credentials``: what they store,
what they print (never a secret), and their refusals (exit 1, one line, nothing changed)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from admin_cli import ok, refused
from sqlalchemy import text

from campaign_trigger.store.db import session_scope
from credentials_support import apns_key, secret_fragments, service_account


@pytest.fixture
def apps() -> tuple[str, str]:
    org = f"org-{uuid.uuid4().hex[:8]}"
    ok("create-org", org)
    android, ios = f"and-{uuid.uuid4().hex[:8]}", f"ios-{uuid.uuid4().hex[:8]}"
    ok("create-app", "--org", org, "--app-id", android, "--platform", "android")
    ok("create-app", "--org", org, "--app-id", ios, "--platform", "ios")
    return android, ios


def stored_row(app_id: str) -> str:
    with session_scope() as session:
        rows = session.execute(
            text("SELECT * FROM appcredentials WHERE app_id = :a"), {"a": app_id}
        ).all()
    return repr(rows)


def test_credentials_are_stored_encrypted_and_shown_without_a_secret(
    apps: tuple[str, str], tmp_path: Path
) -> None:
    android, ios = apps
    account = service_account("shop-prod")
    key = apns_key("com.shop.app")
    account_file, key_file = tmp_path / "sa.json", tmp_path / "AuthKey.p8"
    account_file.write_bytes(account.file_bytes())
    key_file.write_text(key.p8)

    said = ok("set-credentials", "--app-id", android, "--fcm-service-account", str(account_file))
    assert "project shop-prod" in said
    said = ok(
        "set-credentials",
        "--app-id",
        ios,
        "--apns-key",
        str(key_file),
        "--key-id",
        key.key_id,
        "--team-id",
        key.team_id,
        "--topic",
        key.topic,
        "--development",
    )
    assert "(development)" in said

    shown_android, shown_ios = ok("show-app", android), ok("show-app", ios)
    assert "shop-prod" in shown_android
    assert account.private_key_id in shown_android
    assert key.key_id in shown_ios
    assert key.team_id in shown_ios
    assert "com.shop.app" in shown_ios
    assert "development" in shown_ios
    everything = said + shown_android + shown_ios + stored_row(android) + stored_row(ios)
    for pem in (account.private_key, key.p8):
        assert not [f for f in secret_fragments(pem) if f in everything]

    assert "version 2" in ok(
        "set-credentials", "--app-id", android, "--fcm-service-account", str(account_file)
    )
    assert "credentials removed" in ok("remove-credentials", "--app-id", android)
    assert "pushes go to the sandbox" in ok("show-app", android)


def test_set_credentials_refusals_name_the_problem(apps: tuple[str, str], tmp_path: Path) -> None:
    android, ios = apps
    key = apns_key("com.shop.app")
    key_file = tmp_path / "AuthKey.p8"
    key_file.write_text(key.p8)
    not_json = tmp_path / "sa.json"
    not_json.write_text("{")

    assert "either --fcm-service-account" in refused("set-credentials", "--app-id", android)
    assert "needs --key-id" in refused(
        "set-credentials", "--app-id", ios, "--apns-key", str(key_file)
    )
    assert "not JSON" in refused(
        "set-credentials", "--app-id", android, "--fcm-service-account", str(not_json)
    )
    assert "Cannot read" in refused(
        "set-credentials", "--app-id", android, "--fcm-service-account", str(tmp_path / "none")
    )
    assert "is an Android app" in refused(
        "set-credentials",
        "--app-id",
        android,
        "--apns-key",
        str(key_file),
        "--key-id",
        key.key_id,
        "--team-id",
        key.team_id,
        "--topic",
        key.topic,
    )
    assert "Unknown app" in refused("show-app", "nope-" + android)
    assert stored_row(android) == "[]"
