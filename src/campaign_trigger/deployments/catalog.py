"""Every deployment of the service, declared once.

What reads this list:

* ``campaign-trigger runner`` serves the deployments of the ``campaign-trigger`` pool
  (``send-batch``, ``daily-csv-batch``, the maintenance flows);
* :func:`campaign_trigger.deployments.register.ensure_deployments` applies
  ``deliver-request/default``, executed by ``campaign-trigger worker``;
* ``prefect.yaml``, for ``prefect --no-prompt deploy --all`` with process workers, is
  generated from it (``campaign-trigger deployments yaml > prefect.yaml``; a test
  checks the committed file is what the list gives).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from prefect import Flow
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron

TAGS: Final = ["campaign-trigger"]
MAIN_POOL: Final = "campaign-trigger"
DELIVERY_POOL: Final = "campaign-trigger-delivery"
PACKAGE_PATH: Final = "src/campaign_trigger"


@dataclass(frozen=True)
class Schedule:
    cron: str
    slug: str
    active: bool = True
    timezone: str = "UTC"


@dataclass(frozen=True)
class Deployment:
    """One deployment: its flow (``module:function`` under ``campaign_trigger.flows``)."""

    name: str
    flow: str
    description: str
    work_pool: str = MAIN_POOL
    work_queue: str = "default"
    parameters: dict[str, Any] = field(default_factory=dict)
    schedules: tuple[Schedule, ...] = ()

    @property
    def module(self) -> str:
        return self.flow.split(":")[0]

    @property
    def entrypoint(self) -> str:
        module, function = self.flow.split(":")
        return f"{PACKAGE_PATH}/flows/{module}.py:{function}"

    def load_flow(self) -> Flow[..., Any]:
        module, function = self.flow.split(":")
        loaded: Flow[..., Any] = getattr(
            importlib.import_module(f"campaign_trigger.flows.{module}"), function
        )
        return loaded


DELIVER_REQUEST: Final = Deployment(
    name="default",
    flow="deliver:deliver_request",
    description="Delivers one trigger request. One run per request, created by the service "
    "at the request's send time (name = request id, tags campaign:<id> and org:<id>); "
    "executed by `campaign-trigger worker`. Cancel a scheduled run here to cancel the "
    "request.",
    work_pool=DELIVERY_POOL,
)

DELIVER_CHUNKS: Final = Deployment(
    name="default",
    flow="deliver:deliver_chunks",
    description="Delivers a share of a large request's chunks, on whichever worker takes it: "
    "the request's run creates these as its subflows, in the pool's `chunks` queue. Its "
    "chunks show as task runs; a dead worker's share is taken over by another.",
    work_pool=DELIVERY_POOL,
    work_queue="chunks",
)

DEPLOYMENTS: Final = (
    DELIVER_REQUEST,
    DELIVER_CHUNKS,
    Deployment(
        name="send-batch",
        flow="send_batch:send_batch",
        description="Send a batch by hand: pick the campaign, then give JSON messages or the "
        "path of a CSV file in storage. Same checks, request, delivery run and report as the "
        "API.",
    ),
    Deployment(
        name="daily-csv-batch",
        flow="send_batch:send_batch",
        description="Example schedule: every morning at 07:00 UTC, send the CSV file dropped "
        "at incoming/<campaign>/<YYYY-MM-DD>.csv in storage. Inactive until you set the "
        "campaign id and turn the schedule on.",
        parameters={
            "batch": {
                "campaign_id": "demo-campaign",
                "csv_path": "incoming/demo-campaign/{date}.csv",
            }
        },
        schedules=(Schedule("0 7 * * *", slug="daily-csv-batch-morning", active=False),),
    ),
    Deployment(
        name="purge-files",
        flow="maintenance:purge_files",
        description="Every night: delete uploads, message files and report files of ended "
        "requests older than CT_REPORT_RETENTION_DAYS, and those a create left when its "
        "process died before storing the request, once a day old.",
        schedules=(Schedule("30 3 * * *", slug="purge-files-nightly"),),
    ),
    Deployment(
        name="reconcile",
        flow="maintenance:reconcile",
        description="Every 10 minutes: schedule accepted requests still in the outbox, "
        "correct request states that lag behind their delivery runs (the API and workers "
        "also do the first every second; this is the safety net).",
        schedules=(Schedule("*/10 * * * *", slug="reconcile-every-10-minutes"),),
    ),
    Deployment(
        name="settle-in-progress",
        flow="maintenance:settle_in_progress",
        description='Every hour: report rows still "In progress" of requests that ended '
        "over an hour ago become FPErrPushFailed, and their report files are written again.",
        schedules=(Schedule("15 * * * *", slug="settle-in-progress-hourly"),),
    ),
)


def served() -> tuple[Deployment, ...]:
    """The deployments ``campaign-trigger runner`` serves (all but the delivery)."""
    return tuple(d for d in DEPLOYMENTS if d.work_pool == MAIN_POOL)


async def runner_deployment(deployment: Deployment) -> RunnerDeployment:
    """The deployment, served from this process's code."""
    return await deployment.load_flow().ato_deployment(
        name=deployment.name,
        description=deployment.description,
        tags=TAGS,
        parameters=deployment.parameters or None,
        schedules=[
            Cron(s.cron, timezone=s.timezone, slug=s.slug, active=s.active)
            for s in deployment.schedules
        ],
        enforce_parameter_schema=True,
        work_queue_name=deployment.work_queue if deployment.work_pool == DELIVERY_POOL else None,
    )


_YAML_HEADER = """\
# campaign-trigger's Prefect deployments, for a Prefect server with process workers
# (docs/postgres-and-workers.md). GENERATED from src/campaign_trigger/deployments/catalog.py:
# edit that list, then run `campaign-trigger deployments yaml > prefect.yaml`.
# The embedded stack (`campaign-trigger up`) serves the same list without this file.
#
#   prefect work-pool create campaign-trigger --type process
#   campaign-trigger worker        # once: creates the pool campaign-trigger-delivery
#   prefect --no-prompt deploy --all
#   CT_CODE_DIR=$PWD prefect worker start --pool campaign-trigger     # on each machine
#   campaign-trigger worker                                           # delivery workers
#
# deliver-request runs are created one per request by the service and executed by
# `campaign-trigger worker`, the Prefect worker of the pool campaign-trigger-delivery.

"""


def prefect_yaml() -> str:
    """The text of ``prefect.yaml``: the list above, for ``prefect deploy --all``."""
    document = {
        "name": "campaign-trigger",
        "prefect-version": "3.8.8",
        "build": None,
        "push": None,
        # The code is installed on every worker machine (a checkout + `make`): no git
        # clone. CT_CODE_DIR is read on the worker when a run starts.
        "pull": [
            {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $CT_CODE_DIR }}"}}
        ],
        "deployments": [
            {
                "name": d.name,
                "entrypoint": d.entrypoint,
                "description": d.description,
                "tags": list(TAGS),
                "work_pool": {"name": d.work_pool, "work_queue_name": d.work_queue},
                "enforce_parameter_schema": True,
                **({"parameters": d.parameters} if d.parameters else {}),
                "schedules": [
                    {"cron": s.cron, "timezone": s.timezone, "slug": s.slug, "active": s.active}
                    for s in d.schedules
                ],
            }
            for d in DEPLOYMENTS
        ],
    }
    body: str = yaml.safe_dump(document, sort_keys=False, width=88, allow_unicode=True)
    return _YAML_HEADER + body
