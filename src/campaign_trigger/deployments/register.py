"""What the delivery needs on the Prefect server, created or updated idempotently.

* the work pool ``campaign-trigger-delivery``, of the ``campaign-trigger`` worker type
  (``campaign-trigger worker`` polls it; pause it or set a concurrency limit in the UI);
* the deployments ``deliver-request/default`` (one run per request, created by
  ``services.scheduling``) and ``deliver-chunks/default`` (the shares of a large
  request, its subflows, in the pool's ``chunks`` queue);
* the automation :data:`ZOMBIE_AUTOMATION`: a delivery run whose flow-run heartbeats
  stopped (its worker died) is marked Crashed, named "Worker lost", with
  :data:`ZOMBIE_MESSAGE`, and any live worker then takes it over (``deployments.upkeep``).
  At each start of a worker, it watches every run already claimed
  (:func:`watch_claimed_runs`): when it was created anew (its definition changed), the
  old one's watch of them went with it; and once more when the Prefect server has surely
  loaded the automation that start created (``upkeep.watch_again_once_loaded``). Workers
  starting at once leave one (:func:`ensure_automation`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Final
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import Automation, AutomationCore, EventTrigger, Posture
from prefect.exceptions import ObjectAlreadyExists, PrefectHTTPStatusError

from campaign_trigger.config import get_settings
from campaign_trigger.deployments import catalog, heartbeats
from campaign_trigger.services import prefect_runs

logger = logging.getLogger(__name__)

WORKER_TYPE: Final = "campaign-trigger"
ZOMBIE_AUTOMATION: Final = "campaign-trigger: deliveries whose worker died"
ZOMBIE_MESSAGE: Final = prefect_runs.DEAD_RUN_MESSAGE
# A run is watched from its claim (Pending) on: alive while heartbeats arrive, dead when
# neither a heartbeat nor a state at rest comes within the limit. Running is not one of
# them: it follows the claim at once, and a worker sends its runs' heartbeats every eighth
# of the limit, so it told nothing more, and each event the automation watches costs the
# Prefect server its trigger's evaluation (reads and writes of its bucket: Running's were
# about a tenth of the server's CPU a one-message request, docs/benchmarks.md).
_ALIVE_EVENTS: Final = {"prefect.flow-run.heartbeat", "prefect.flow-run.Pending"}
_AT_REST_EVENTS: Final = {
    f"prefect.flow-run.{name}"
    for name in (
        "Scheduled",
        "Late",
        "Completed",
        "Failed",
        "Cancelled",
        "Cancelling",
        "Crashed",
        "Paused",
        "AwaitingRetry",
    )
}
WATCHED: Final = "campaign-trigger.flow-run.watched"
"""Posted at each worker's start for each run already claimed: it starts the watch of a run
not watched, as a claim does (:func:`watch_claimed_runs`)."""
_PAGE = 200
# Prefect's triggers service loads an automation just created by itself, after the
# creation's commit (a task on the server's loop on SQLite, PostgreSQL's NOTIFY to the
# services' process otherwise), and at the latest at its next look at the automations,
# every 5 s: an event it evaluates before then is not seen by the automation, and a run
# whose worker is already dead sends no other. The runs claimed are watched again this
# long after a start that created the automation.
AUTOMATION_LOADED_SECONDS: Final = 15.0


@dataclass(frozen=True)
class Registered:
    """What :func:`ensure_deployments` applied: the delivery deployments' ids, and whether
    it created the dead-run automation."""

    deployment_ids: list[str]
    automation_created: bool


async def _ensure_pool(client: PrefectClient) -> None:
    """The pool, with the worker type's job template (one made by an earlier version,
    with Prefect's default template, is given it); its pause and concurrency limit are
    the operator's and stay as they are."""
    from campaign_trigger.deployments.worker import DeliveryWorker

    template = DeliveryWorker.get_default_base_job_template()
    try:
        await client.create_work_pool(
            WorkPoolCreate(
                name=catalog.DELIVERY_POOL,
                type=WORKER_TYPE,
                base_job_template=template,
                description="Deliveries of campaign-trigger requests, run by "
                "`campaign-trigger worker` processes in-process.",
            )
        )
    except ObjectAlreadyExists:
        pool = await client.read_work_pool(catalog.DELIVERY_POOL)
        if pool.base_job_template != template:
            await client.update_work_pool(
                catalog.DELIVERY_POOL, WorkPoolUpdate(base_job_template=template)
            )


def zombie_automation(*, deployment_ids: list[str], within_seconds: int) -> AutomationCore:
    """Dead runs of the delivery deployments become Crashed, named "Worker lost" (with
    :data:`ZOMBIE_MESSAGE`)."""
    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="A delivery run claimed that then neither sent a heartbeat nor came "
        f"to rest for {within_seconds} s lost its worker: mark it Crashed; "
        "campaign-trigger workers take such runs over and resume at the first unrecorded message.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={
                "prefect.resource.id": [f"prefect.deployment.{d}" for d in deployment_ids],
                "prefect.resource.role": "deployment",
            },
            after=_ALIVE_EVENTS | {WATCHED},
            expect=_ALIVE_EVENTS | _AT_REST_EVENTS,
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_seconds),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                name=prefect_runs.DEAD_RUN_STATE_NAME,
                message=ZOMBIE_MESSAGE,
            )
        ],
    )


async def ensure_automation(client: PrefectClient, wanted: AutomationCore) -> bool:
    """Leave exactly one automation named ``wanted.name``, defined as ``wanted``: create it
    if none is, delete every other of that name (an earlier version's, or a copy made by a
    worker starting at the same moment: each start read none and created its own, and
    every copy then cost the Prefect server its trigger's work on each watched event and
    acted on each dead run). Workers starting together keep the same one, the lowest id
    among those defined as ``wanted``, so their deletions agree; one of another version,
    made in between by a worker of that version, is left to the next start. Returns whether
    this call created it."""

    def current(automation: Automation) -> bool:
        return automation.trigger == wanted.trigger and automation.actions == wanted.actions

    existing = await client.read_automations_by_name(wanted.name)
    created = not any(current(a) for a in existing)
    if created:
        await client.create_automation(wanted)
        existing = await client.read_automations_by_name(wanted.name)
    keep = min((a.id for a in existing if current(a)), default=None)
    if keep is None:  # an older version starting at once replaced it: leave its own
        return created
    for automation in existing:
        if automation.id != keep:
            try:
                await client.delete_automation(automation.id)
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code != 404:  # 404: another start deleted it first
                    raise
    return created


async def watch_claimed_runs(client: PrefectClient, deployment_ids: list[str]) -> int:
    """Start the dead-run automation's watch of every run of the deployments already
    claimed (Pending or Running) that it does not watch yet: one :data:`WATCHED` event
    each, posted to the server. A run's watch lives in the automation's own records (its
    buckets), which an automation deleted takes with it: without this, a run whose worker
    died shortly before the automation was created anew (an upgrade that changed it)
    would never be marked dead nor taken over. A run already watched is left as it is (the
    event only starts a watch); a live run's heartbeats go on as before; a dead one is
    marked after ``CT_DEAD_RUN_AFTER_SECONDS``. Returns how many runs it named."""
    deployments = FlowRunFilterDeploymentId(any_=[UUID(d) for d in deployment_ids])
    claimed = FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING])
    )
    # Paged by the runs already named, not by an offset: a run coming to rest between two
    # pages would shift the next one by a run, never named.
    named: list[UUID] = []
    while page := await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=deployments,
            state=claimed,
            id=FlowRunFilterId(not_any_=named) if named else None,
        ),
        limit=_PAGE,
    ):
        events = [heartbeats.run_event(WATCHED, run).model_dump(mode="json") for run in page]
        await client.request("POST", "/events", json=events)
        named.extend(run.id for run in page)
    return len(named)


async def ensure_deployments() -> Registered:
    """Create or update the pool, the deployments and the automation, and have the
    automation watch the runs already claimed (idempotent; safe from several
    processes)."""
    deployment_ids = []
    async with get_client() as client:
        await _ensure_pool(client)
        for deployment in (catalog.DELIVER_REQUEST, catalog.DELIVER_CHUNKS):
            runner = await catalog.runner_deployment(deployment)
            deployment_ids.append(str(await runner.aapply(work_pool_name=catalog.DELIVERY_POOL)))
        wanted = zombie_automation(
            deployment_ids=deployment_ids, within_seconds=get_settings().dead_run_after_seconds
        )
        created = await ensure_automation(client, wanted)
        watched = await watch_claimed_runs(client, deployment_ids)
    prefect_runs.forget_deployment_id()
    logger.info(
        "delivery deployments: %s; dead-run automation %s; runs claimed, watched for their "
        "worker's death: %d",
        ", ".join(deployment_ids),
        "created" if created else "kept",
        watched,
    )
    return Registered(deployment_ids, created)
