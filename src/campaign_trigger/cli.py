"""The ``campaign-trigger`` command: the embedded stack, its parts, and tenant admin."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignTriggerError

if TYPE_CHECKING:
    from sqlmodel import Session

T = TypeVar("T")

app = typer.Typer(
    help="Campaign-trigger: API-trigger campaigns of push and in-app messages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
admin_app = typer.Typer(
    help="Administer tenants: organisations, accounts, apps, campaigns, devices.",
    no_args_is_help=True,
)
app.add_typer(admin_app, name="admin")


def _say(text: str) -> None:
    typer.echo(text)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _migrate() -> None:
    from campaign_trigger.store.migrate import upgrade

    upgrade(get_settings().database_url)


def _in_session(action: Callable[[Session], T]) -> T:
    """Run ``action(session)`` in one transaction after migrating; map refusals to exit 1."""
    from campaign_trigger.store.db import session_scope

    try:
        _migrate()
        with session_scope() as session:
            return action(session)
    except CampaignTriggerError as exc:
        _fail(exc.message)


@admin_app.command("migrate")
def admin_migrate() -> None:
    """Apply the database migrations."""
    _migrate()
    _say("Database is up to date.")


@admin_app.command("create-org")
def admin_create_org(
    name: str, quota: Annotated[int, typer.Option(help="Request quota per period.")] = 10_000
) -> None:
    """Create an organisation (a subscription with a request quota)."""
    from campaign_trigger.services import admin

    org = _in_session(lambda s: admin.create_org(session=s, name=name, quota=quota))
    _say(f"Created organisation {org.name} (quota {org.request_quota}).")


@admin_app.command("create-account")
def admin_create_account(
    org: Annotated[str, typer.Option("--org", help="Organisation name.")],
    email: Annotated[str, typer.Option("--email")],
    password: Annotated[str, typer.Option("--password")],
    role: Annotated[str, typer.Option(help="owner, admin, member or viewer.")] = "member",
) -> None:
    """Create an account that signs in to the API."""
    from campaign_trigger.services import admin

    account = _in_session(
        lambda s: admin.create_account(
            session=s, org_name=org, email=email, password=password, role=role
        )
    )
    _say(f"Created account {account.email} ({account.role.value}) in {org}.")


@admin_app.command("create-app")
def admin_create_app(
    org: Annotated[str, typer.Option("--org")],
    app_id: Annotated[str, typer.Option("--app-id")],
    platform: Annotated[str, typer.Option("--platform", help="android or ios.")],
) -> None:
    """Create an app; prints its SDK key for device registration."""
    from campaign_trigger.services import admin

    created = _in_session(
        lambda s: admin.create_app(session=s, org_name=org, app_id=app_id, platform=platform)
    )
    _say(f"Created {created.platform.value} app {created.app_id}; SDK key {created.sdk_key}")


@admin_app.command("create-campaign")
def admin_create_campaign(
    org: Annotated[str, typer.Option("--org")],
    app_id: Annotated[list[str], typer.Option("--app-id", help="Repeat for several apps.")],
    channel: Annotated[str, typer.Option("--channel", help="push or inapp.")],
    title: Annotated[str, typer.Option("--title")],
    body: Annotated[str, typer.Option("--body")],
    campaign_id: Annotated[str | None, typer.Option("--campaign-id")] = None,
) -> None:
    """Create a draft API-trigger campaign; prints its id last."""
    from campaign_trigger.services import admin

    campaign = _in_session(
        lambda s: admin.create_campaign(
            session=s,
            org_name=org,
            app_ids=app_id,
            channel=channel,
            title=title,
            body=body,
            campaign_id=campaign_id,
        )
    )
    variables = ", ".join(campaign.variables) or "none"
    _say(f"Created draft campaign (variables: {variables}): {campaign.id}")


@admin_app.command("launch-campaign")
def admin_launch_campaign(campaign_id: str) -> None:
    """draft → started: the campaign accepts batches."""
    from campaign_trigger.services import admin

    _in_session(lambda s: admin.launch_campaign(session=s, campaign_id=campaign_id))
    _say(f"Campaign {campaign_id} started.")


@admin_app.command("end-campaign")
def admin_end_campaign(campaign_id: str) -> None:
    """started → ended: the campaign accepts no more batches."""
    from campaign_trigger.services import admin

    _in_session(lambda s: admin.end_campaign(session=s, campaign_id=campaign_id))
    _say(f"Campaign {campaign_id} ended.")


@admin_app.command("import-devices")
def admin_import_devices(
    file: Annotated[
        Path, typer.Argument(help="CSV: device_id,user_id,push_token,opted_in,logged_in")
    ],
    app_id: Annotated[str, typer.Option("--app-id")],
) -> None:
    """Insert or update an app's devices from a CSV file."""
    from campaign_trigger.services import admin

    count = _in_session(lambda s: admin.import_devices(session=s, app_id=app_id, path=file))
    _say(f"Imported {count} devices into {app_id}.")


@app.command()
def up(
    no_demo: Annotated[bool, typer.Option("--no-demo", help="Do not seed the demo.")] = False,
) -> None:
    """Run the whole stack on this machine until Ctrl-C."""
    from campaign_trigger import stack

    settings = get_settings()
    try:
        children, shared_env = stack.plan(settings)
    except CampaignTriggerError as exc:
        _fail(exc.message)
    _say("Migrating the database …")
    _migrate()
    tenant = None
    if not no_demo:
        from campaign_trigger.services import demo
        from campaign_trigger.store.db import session_scope

        _say("Seeding the demo tenant …")
        with session_scope() as session:
            tenant = demo.seed(session=session, home=settings.home.resolve())

    def on_ready() -> None:
        api = f"http://{settings.api_host}:{settings.api_port}"
        lines = [
            "",
            "campaign-trigger is up.",
            f"  API           {api}  (OpenAPI: {api}/docs)",
            f"  Prefect UI    {shared_env['PREFECT_API_URL'].removesuffix('/api')}",
            f"  Sandbox       http://{settings.sandbox_host}:{settings.sandbox_port}",
        ]
        if tenant is not None:
            lines += [
                "",
                "Demo tenant:",
                f"  e-mail        {tenant.email}",
                f"  password      {tenant.password}",
                f"  campaign id   {tenant.campaign_id}  (variables first_name, order_id)",
            ]
        lines += ["", "Press Ctrl-C to stop."]
        _say("\n".join(lines))

    try:
        code = stack.run(
            children,
            shared_env,
            log_dir=settings.home.resolve() / "logs",
            say=_say,
            on_ready=on_ready,
        )
    except CampaignTriggerError as exc:
        _fail(exc.message)
    raise typer.Exit(code)


@app.command()
def api() -> None:
    """Run the HTTP API alone."""
    import uvicorn

    settings = get_settings()
    uvicorn.run(
        "campaign_trigger.api.app:create_app",
        factory=True,
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        access_log=False,
    )


@app.command()
def sandbox(
    latency_ms: Annotated[float, typer.Option(help="Added to every answer.")] = 0.0,
) -> None:
    """Run the sandbox push providers (FCM and APNs stand-ins) alone."""
    from campaign_trigger.delivery.sandbox import serve

    settings = get_settings()
    serve(host=settings.sandbox_host, port=settings.sandbox_port, latency_ms=latency_ms)


@app.command()
def worker(concurrency: Annotated[int, typer.Option(help="Runs executed at once.")] = 4) -> None:
    """Run a delivery worker: claims due deliver-request runs and executes them."""
    from campaign_trigger.deployments.worker import main as worker_main

    worker_main(concurrency=concurrency)


@app.command()
def runner(limit: Annotated[int, typer.Option(help="Flow runs executed at once.")] = 4) -> None:
    """Serve the send-batch, daily-csv-batch and maintenance deployments."""
    from campaign_trigger.deployments.runner import main as runner_main

    runner_main(limit=limit)


def main() -> None:
    app(prog_name="campaign-trigger")


if __name__ == "__main__":
    main()
