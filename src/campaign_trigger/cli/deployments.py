"""``campaign-trigger deployments``: the service's Prefect deployments."""

from __future__ import annotations

import typer

from campaign_trigger.cli.base import app

deployments_app = typer.Typer(help="The service's Prefect deployments.", no_args_is_help=True)
app.add_typer(deployments_app, name="deployments")


@deployments_app.command("yaml")
def deployments_yaml() -> None:
    """Print prefect.yaml as the deployment catalog declares it."""
    from campaign_trigger.deployments.catalog import prefect_yaml

    typer.echo(prefect_yaml(), nl=False)
