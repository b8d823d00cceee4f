"""``campaign-trigger runner``: serves the deployments other than ``deliver-request``.

``send-batch`` (the UI form), ``daily-csv-batch`` (an example cron schedule, inactive)
and the maintenance deployments ``purge-files``, ``reconcile`` and
``settle-in-progress``, with the names, parameters and schedules of ``prefect.yaml``
(a test keeps the two in step). ``prefect.serve`` polls the Prefect API and runs each
flow run in its own process; ``campaign-trigger up`` starts this as a child process.
``deliver-request`` runs are executed by ``campaign-trigger worker`` instead.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from prefect import get_client, serve
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Schedule
from prefect.utilities.asyncutils import run_coro_as_sync

from campaign_trigger.flows.maintenance import purge_files, reconcile, settle_in_progress
from campaign_trigger.flows.send_batch import send_batch

logger = logging.getLogger(__name__)

TAGS = ["campaign-trigger"]
DAILY_CSV_PARAMETERS: dict[str, Any] = {
    "batch": {"campaign_id": "demo-campaign", "csv_path": "incoming/demo-campaign/{date}.csv"}
}


def _cron(cron: str, *, slug: str, active: bool = True) -> list[Schedule]:
    return [Cron(cron, timezone="UTC", slug=slug, active=active)]


def deployments() -> list[RunnerDeployment]:
    """What the runner serves; the same as ``prefect.yaml`` (but ``default``, the delivery)."""
    served: list[RunnerDeployment] = run_coro_as_sync(adeployments())
    return served


async def adeployments() -> list[RunnerDeployment]:
    """:func:`deployments`, from async code."""
    common: dict[str, Any] = {"tags": TAGS, "enforce_parameter_schema": True}
    return [
        await send_batch.ato_deployment(
            name="send-batch",
            description="Send a batch by hand: pick the campaign, then give JSON messages or "
            "the path of a CSV file in storage. Same checks, request, delivery run and "
            "report as the API.",
            **common,
        ),
        await send_batch.ato_deployment(
            name="daily-csv-batch",
            description="Example schedule: every morning at 07:00 UTC, send the CSV file "
            "dropped at incoming/<campaign>/<YYYY-MM-DD>.csv in storage. Inactive until "
            "you set the campaign id and turn the schedule on.",
            parameters=DAILY_CSV_PARAMETERS,
            schedules=_cron("0 7 * * *", slug="daily-csv-batch-morning", active=False),
            **common,
        ),
        await purge_files.ato_deployment(
            name="purge-files",
            description="Every night: delete uploads and report files of ended requests "
            "older than CT_REPORT_RETENTION_DAYS.",
            schedules=_cron("30 3 * * *", slug="purge-files-nightly"),
            **common,
        ),
        await reconcile.ato_deployment(
            name="reconcile",
            description="Every 10 minutes: schedule accepted requests still in the outbox, "
            "correct request states that lag behind their delivery runs (the API and "
            "workers also do the first every second; this is the safety net).",
            schedules=_cron("*/10 * * * *", slug="reconcile-every-10-minutes"),
            **common,
        ),
        await settle_in_progress.ato_deployment(
            name="settle-in-progress",
            description='Every hour: report rows still "In progress" of requests that '
            "ended over an hour ago become FPErrPushFailed, and their report files are "
            "written again.",
            schedules=_cron("15 * * * *", slug="settle-in-progress-hourly"),
            **common,
        ),
    ]


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
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    served = deployments()
    run_coro_as_sync(take_over(served))
    logger.info(
        "serving %s (at most %d runs at once)",
        ", ".join(f"{d.flow_name}/{d.name}" for d in served),
        limit,
    )
    serve(*served, limit=limit, print_starting_message=False, query_seconds=query_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--limit", type=int, default=4, help="Flow runs executed at once.")
    arguments = parser.parse_args()
    main(limit=arguments.limit)
