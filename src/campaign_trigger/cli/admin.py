"""``campaign-trigger admin``: organisations, accounts, apps, campaigns, devices."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from campaign_trigger.cli import campaigns, credentials, identity, webhooks
from campaign_trigger.cli.base import app, fail, in_session, migrate, say

admin_app = typer.Typer(
    help="Administer tenants: organisations, accounts, apps, campaigns, devices, webhooks.",
    no_args_is_help=True,
)
app.add_typer(admin_app, name="admin")


@admin_app.command("migrate")
def admin_migrate() -> None:
    """Apply the database migrations."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.store.migrate import current_revision

    url = get_settings().database_url
    before = current_revision(url)
    migrate()
    after = current_revision(url)
    if before == after:
        say(f"Database is up to date (revision {after}).")
    elif before is None:
        say(f"Database created (revision {after}).")
    else:
        say(f"Database migrated from revision {before} to {after}.")


@admin_app.command("create-org")
def admin_create_org(
    name: str, quota: Annotated[int, typer.Option(help="Request quota per period.")] = 10_000
) -> None:
    """Create an organisation (a subscription with a request quota)."""
    from campaign_trigger.services import admin

    org = in_session(lambda s: admin.create_org(session=s, name=name, quota=quota))
    say(f"Created organisation {org.name} (quota {org.request_quota}).")


@admin_app.command("create-account")
def admin_create_account(
    org: Annotated[str, typer.Option("--org", help="Organisation name.")],
    email: Annotated[str, typer.Option("--email")],
    password: Annotated[str, typer.Option("--password")],
    role: Annotated[str, typer.Option(help="owner, admin, member or viewer.")] = "member",
) -> None:
    """Create an account that signs in to the API."""
    from campaign_trigger.services import admin

    account = in_session(
        lambda s: admin.create_account(
            session=s, org_name=org, email=email, password=password, role=role
        )
    )
    say(f"Created account {account.email} ({account.role.value}) in {org}.")


@admin_app.command("create-app")
def admin_create_app(
    org: Annotated[str, typer.Option("--org")],
    app_id: Annotated[str, typer.Option("--app-id")],
    platform: Annotated[str, typer.Option("--platform", help="android or ios.")],
) -> None:
    """Create an app; prints its SDK key for device registration."""
    from campaign_trigger.services import admin

    created = in_session(
        lambda s: admin.create_app(session=s, org_name=org, app_id=app_id, platform=platform)
    )
    say(f"Created {created.platform.value} app {created.app_id}; SDK key {created.sdk_key}")
    say(
        "Identity verification is off; see show-identity-key and set-identity-verification "
        "(docs/devices-and-inbox.md)."
    )


identity.register(admin_app, in_session=in_session, say=say)
credentials.register(admin_app, in_session=in_session, say=say, fail=fail)
campaigns.register(admin_app, in_session=in_session, say=say, fail=fail)
webhooks.register(admin_app, in_session=in_session, say=say)


@admin_app.command("launch-campaign")
def admin_launch_campaign(campaign_id: str) -> None:
    """draft → started: the campaign accepts batches."""
    from campaign_trigger.services import admin

    in_session(lambda s: admin.launch_campaign(session=s, campaign_id=campaign_id))
    say(f"Campaign {campaign_id} started.")


@admin_app.command("end-campaign")
def admin_end_campaign(campaign_id: str) -> None:
    """started → ended: the campaign accepts no more batches."""
    from campaign_trigger.services import admin

    in_session(lambda s: admin.end_campaign(session=s, campaign_id=campaign_id))
    say(f"Campaign {campaign_id} ended.")


@admin_app.command("import-devices")
def admin_import_devices(
    file: Annotated[
        Path, typer.Argument(help="CSV: device_id,user_id,push_token,opted_in,logged_in")
    ],
    app_id: Annotated[str, typer.Option("--app-id")],
) -> None:
    """Insert or update an app's devices from a CSV file (a progress bar on a terminal)."""
    from campaign_trigger.progress import progress_bar
    from campaign_trigger.services import admin

    with progress_bar("Importing devices") as progress:
        count = in_session(
            lambda s: admin.import_devices(session=s, app_id=app_id, path=file, progress=progress)
        )
    say(f"Imported {count} devices into {app_id}.")
