"""``campaign-trigger runner``: serves the deployments other than ``deliver-request``.

``send-batch`` (the UI form), ``daily-csv-batch`` (an example cron schedule, inactive)
and the maintenance deployments ``purge-files``, ``reconcile`` and
``settle-in-progress``, as ``deployments/catalog.py`` declares them (``prefect.yaml``
is generated from the same list). ``prefect.serve`` polls the Prefect API and runs
each flow run in its own process; ``campaign-trigger up`` starts this as a child
process. ``deliver-request`` runs are executed by ``campaign-trigger worker`` instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import get_client, serve
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.deployments.runner import RunnerDeployment
from prefect.utilities.asyncutils import run_coro_as_sync

from campaign_trigger import logs
from campaign_trigger.config import get_settings
from campaign_trigger.deployments import catalog

logger = logging.getLogger(__name__)


def deployments() -> list[RunnerDeployment]:
    """What the runner serves: the catalog's deployments of the ``campaign-trigger`` pool."""
    served: list[RunnerDeployment] = run_coro_as_sync(adeployments())
    return served


async def adeployments() -> list[RunnerDeployment]:
    """:func:`deployments`, from async code."""
    return [await catalog.runner_deployment(d) for d in catalog.served()]


async def take_over(served: list[RunnerDeployment]) -> None:
    """Apply the deployments, and give them back the code path of a served deployment.

    A deployment last written by ``prefect deploy`` has no path (its pull step moved to
    the code); serving only updates it, which clears the pull step but leaves the path
    unset, and its runs would then crash looking for their code.
    """
    async with get_client() as client:
        for deployment in served:
            deployment_id = await deployment.aapply()
            path = getattr(deployment, "_path", None) or str(Path.cwd())
            await client.update_deployment(deployment_id, DeploymentUpdate(path=str(path)))


def main(*, limit: int = 4, query_seconds: float = 2.0) -> None:
    """Serve the deployments until interrupted (SIGINT/SIGTERM)."""
    logs.configure(get_settings().log_format)
    served = deployments()
    run_coro_as_sync(take_over(served))
    logger.info(
        "serving %s (at most %d runs at once)",
        ", ".join(f"{d.flow_name}/{d.name}" for d in served),
        limit,
    )
    serve(*served, limit=limit, print_starting_message=False, query_seconds=query_seconds)
