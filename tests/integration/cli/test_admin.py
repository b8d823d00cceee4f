"""Every admin command: what it creates, and that a refusal exits 1 and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from admin_cli import ok, refused
from sqlmodel import select

from campaign_trigger.services.passwords import verify_password
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Account, App, Campaign, CampaignState, Device
from support import run_on_terminal


@pytest.fixture
def org() -> str:
    name = f"org-{uuid.uuid4().hex[:8]}"
    ok("create-org", name, "--quota", "50")
    return name


@pytest.fixture
def android_app(org: str) -> str:
    app_id = f"app-{uuid.uuid4().hex[:8]}"
    ok("create-app", "--org", org, "--app-id", app_id, "--platform", "android")
    return app_id


def test_migrate_is_repeatable() -> None:
    assert "up to date" in ok("migrate")
    assert "up to date" in ok("migrate")


def test_migrate_says_it_created_an_empty_database(tmp_path: Path) -> None:

    env = {**os.environ, "CT_DATABASE_URL": f"sqlite:///{tmp_path / 'new.sqlite'}"}
    command = [sys.executable, "-m", "campaign_trigger.cli", "admin", "migrate"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert first.stdout.startswith("Database created (revision ")
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert again.stdout.startswith("Database is up to date (revision ")


def test_create_org_refuses_a_duplicate_and_a_negative_quota(org: str) -> None:
    assert "already exists" in refused("create-org", org)
    assert "Quota" in refused("create-org", "other-" + org, "--quota", "-1")


def test_create_account_stores_a_verifiable_password_and_the_role(org: str) -> None:
    email = f"{uuid.uuid4().hex[:6]}@example.com"
    ok(
        "create-account",
        "--org",
        org,
        "--email",
        email,
        "--password",
        "s3cret-pass",
        "--role",
        "viewer",
    )
    with session_scope() as session:
        account = session.exec(select(Account).where(Account.email == email)).one()
    assert account.role == "viewer"
    assert verify_password(account.password_hash, "s3cret-pass")
    assert not verify_password(account.password_hash, "wrong-pass")


def test_create_account_refusals_change_nothing(org: str) -> None:
    email = f"{uuid.uuid4().hex[:6]}@example.com"
    ok("create-account", "--org", org, "--email", email, "--password", "s3cret-pass")
    assert "already exists" in refused(
        "create-account", "--org", org, "--email", email, "--password", "another-pass"
    )
    assert "Unknown organisation" in refused(
        "create-account",
        "--org",
        "nope-" + org,
        "--email",
        "x" + email,
        "--password",
        "s3cret-pass",
    )
    assert "Unknown role" in refused(
        "create-account",
        "--org",
        org,
        "--email",
        "y" + email,
        "--password",
        "s3cret-pass",
        "--role",
        "god",
    )
    with session_scope() as session:
        emails = session.exec(select(Account.email).where(Account.email.endswith(email))).all()
    assert emails == [email]


def test_create_app_prints_an_sdk_key_and_refuses_bad_input(org: str) -> None:
    app_id = f"app-{uuid.uuid4().hex[:8]}"
    output = ok("create-app", "--org", org, "--app-id", app_id, "--platform", "ios")
    with session_scope() as session:
        created = session.exec(select(App).where(App.app_id == app_id)).one()
    assert created.sdk_key in output
    assert created.platform == "ios"
    assert "Unknown platform" in refused(
        "create-app", "--org", org, "--app-id", "x" + app_id, "--platform", "windows"
    )
    assert "already exists" in refused(
        "create-app", "--org", org, "--app-id", app_id, "--platform", "ios"
    )
    assert "Unknown organisation" in refused(
        "create-app", "--org", "no-" + org, "--app-id", "y" + app_id, "--platform", "ios"
    )


def test_campaign_is_created_as_a_draft_and_moves_draft_started_ended(
    org: str, android_app: str
) -> None:
    output = ok(
        "create-campaign",
        "--org",
        org,
        "--app-id",
        android_app,
        "--channel",
        "push",
        "--title",
        "Hi {{ first_name }}",
        "--body",
        "{{ city }} and {{first_name}}",
    )
    campaign_id = output.split()[-1]
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        assert campaign.state == CampaignState.draft
        assert campaign.variables == ["first_name", "city"]
    assert "only a started campaign" in refused("end-campaign", campaign_id)
    ok("launch-campaign", campaign_id)
    assert "only a draft campaign" in refused("launch-campaign", campaign_id)
    ok("end-campaign", campaign_id)
    assert "only a draft campaign" in refused("launch-campaign", campaign_id)
    assert "Unknown campaign" in refused("launch-campaign", "nope")


def test_create_campaign_takes_a_chosen_id_and_several_apps(org: str, android_app: str) -> None:
    ios = f"ios-{uuid.uuid4().hex[:8]}"
    ok("create-app", "--org", org, "--app-id", ios, "--platform", "ios")
    chosen = f"camp-{uuid.uuid4().hex[:8]}"
    output = ok(
        "create-campaign",
        "--org",
        org,
        "--app-id",
        android_app,
        "--app-id",
        ios,
        "--channel",
        "inapp",
        "--title",
        "T",
        "--body",
        "B",
        "--campaign-id",
        chosen,
    )
    assert output.split()[-1] == chosen
    assert "already exists" in refused(
        "create-campaign",
        "--org",
        org,
        "--app-id",
        ios,
        "--channel",
        "push",
        "--title",
        "T",
        "--body",
        "B",
        "--campaign-id",
        chosen,
    )


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--channel", "sms", "--title", "T", "--body", "B"], "Unknown channel"),
        (["--channel", "push", "--title", "{{ user.name }}", "--body", "B"], "Unsupported"),
        (["--channel", "push", "--title", "{% if x %}", "--body", "B"], "Unsupported"),
    ],
)
def test_create_campaign_refuses_bad_input(
    org: str, android_app: str, extra: list[str], reason: str
) -> None:
    assert reason in refused("create-campaign", "--org", org, "--app-id", android_app, *extra)


def test_create_campaign_refuses_another_orgs_app(org: str, android_app: str) -> None:
    other = f"org-{uuid.uuid4().hex[:8]}"
    ok("create-org", other)
    assert "Unknown app" in refused(
        "create-campaign",
        "--org",
        other,
        "--app-id",
        android_app,
        "--channel",
        "push",
        "--title",
        "T",
        "--body",
        "B",
    )


def _devices(app_id: str) -> list[Device]:
    with session_scope() as session:
        return list(
            session.exec(
                select(Device).where(Device.app_id == app_id).order_by(Device.device_id)
            ).all()
        )


def test_import_devices_inserts_then_updates(android_app: str, tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text(
        "device_id,user_id,push_token,opted_in,logged_in\n"
        "d1,u1,tok-1,true,true\nd2,u2,tok-2,false,yes\nd3,,,1,0\n"
    )
    assert "Imported 3" in ok("import-devices", "--app-id", android_app, str(path))
    path.write_text("device_id,user_id,push_token,opted_in,logged_in\nd1,u9,tok-9,true,false\n")
    ok("import-devices", "--app-id", android_app, str(path))
    devices = _devices(android_app)
    assert [(d.device_id, d.user_id, d.push_token, d.opted_in, d.logged_in) for d in devices] == [
        ("d1", "u9", "tok-9", True, False),
        ("d2", "u2", "tok-2", False, True),
        ("d3", None, None, True, False),
    ]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("device_id,user_id,push_token\nd1,u1,t\n", "lacks column(s): opted_in, logged_in"),
        (
            "device_id,user_id,push_token,opted_in,logged_in\nd1,u1,t,true,true\n"
            "d2,u2,t,maybe,true\n",
            "Line 3: opted_in must be true or false",
        ),
        (
            "device_id,user_id,push_token,opted_in,logged_in\n,u1,t,true,true\n",
            "device_id is empty",
        ),
        (
            "device_id,user_id,push_token,opted_in,logged_in\nd1,u1,t,true,true,extra\n",
            "wrong number of fields",
        ),
    ],
)
def test_import_devices_refuses_a_bad_file_whole(
    android_app: str, tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "devices.csv"
    path.write_text(content)
    assert reason in refused("import-devices", "--app-id", android_app, str(path))
    assert _devices(android_app) == []


def test_import_devices_refuses_an_unknown_app_and_a_missing_file(tmp_path: Path) -> None:
    assert "Unknown app" in refused("import-devices", "--app-id", "nope", str(tmp_path / "x"))


def test_console_script_runs_and_fails_with_a_one_line_reason() -> None:
    command = Path(sys.executable).with_name("campaign-trigger")
    result = subprocess.run(
        [str(command), "admin", "create-org", "org-" + uuid.uuid4().hex],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    result = subprocess.run(
        [str(command), "admin", "launch-campaign", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: Unknown campaign 'nope'"


def test_identity_verification_is_shown_rotated_and_switched(android_app: str) -> None:
    shown = ok("show-identity-key", "--app-id", android_app)
    assert f"App {android_app}: identity verification off" in shown
    key = shown.split("Identity key: ", 1)[1].strip()
    assert key.startswith("idk_")
    assert len(key) > 40
    rotated = ok("rotate-identity-key", "--app-id", android_app).split("Identity key: ", 1)[1]
    assert rotated.strip() != key
    assert "identity verification on" in ok(
        "set-identity-verification", "--app-id", android_app, "--on"
    )
    with session_scope() as session:
        app = session.exec(select(App).where(App.app_id == android_app)).one()
        assert (app.identity_verification, app.identity_key) == (True, rotated.strip())
    ok("set-identity-verification", "--app-id", android_app, "--off")
    with session_scope() as session:
        app = session.exec(select(App).where(App.app_id == android_app)).one()
        assert app.identity_verification is False


@pytest.mark.parametrize(
    "command",
    [
        ["show-identity-key"],
        ["rotate-identity-key"],
        ["set-identity-verification", "--on"],
    ],
)
def test_identity_commands_refuse_an_unknown_app(command: list[str]) -> None:
    assert "Unknown app" in refused(*command, "--app-id", "no-such-app")


def test_import_devices_draws_a_progress_bar_on_a_terminal(
    android_app: str, tmp_path: Path
) -> None:
    path = tmp_path / "devices.csv"
    rows = "".join(f"d{n},u{n},tok-{n},true,true\n" for n in range(120_000))
    path.write_text("device_id,user_id,push_token,opted_in,logged_in\n" + rows)
    command = Path(sys.executable).with_name("campaign-trigger")
    code, text = run_on_terminal(
        [str(command), "admin", "import-devices", "--app-id", android_app, str(path)]
    )
    assert code == 0, text
    assert "Importing devices" in text  # the bar, drawn on the terminal
    assert "120000" in text or "120,000" in text, text
    assert "Imported 120000 devices" in text
    assert len(_devices(android_app)) == 120_000
