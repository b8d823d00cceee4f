"""The few Prefect API calls the service makes about ``deliver-request`` flow runs.

Everything that talks to the Prefect server about our runs lives here, so the
scheduling, lifecycle and worker modules read as use cases. The run of a request
is found by its id (``Request.flow_run_id``); runs are created with the request
id as name and idempotency key, so a repeated create returns the same run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterId,
    FlowRunFilterNextScheduledStartTime,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateName,
    FlowRunFilterStateType,
    WorkerFilter,
    WorkerFilterStatus,
)
from prefect.client.schemas.objects import FlowRun, StateType, WorkerStatus
from prefect.client.schemas.responses import OrchestrationResult, SetStateStatus
from prefect.client.schemas.sorting import FlowRunSort
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Cancelling, Completed, Pending

logger = logging.getLogger(__name__)

FLOW_NAME = "deliver-request"
DEPLOYMENT_NAME = "default"
DEPLOYMENT_FULL_NAME = f"{FLOW_NAME}/{DEPLOYMENT_NAME}"
CHUNKS_DEPLOYMENT_FULL_NAME = "deliver-chunks/default"
BULK_LIMIT = 100  # the server's BULK_CREATE_LIMIT for create_flow_run/bulk
PAGE_LIMIT = 200  # the server's largest page of flow runs

CANCEL_CLAIM_MESSAGE = "campaign-trigger: claimed to cancel"
# The dead-run automation's verdict (deployments/register.py): a worker takes such a run over.
DEAD_RUN_MESSAGE = "Its worker stopped sending heartbeats: taken over by another worker"
# ... and the name of that Crashed state: the sweep asks for these runs alone, not for
# every run that ever crashed (a number that only grows).
DEAD_RUN_STATE_NAME = "Worker lost"
WORKER_CLAIM_PREFIX = "campaign-trigger worker "

_deployment_ids: dict[str, UUID] = {}
_shared: dict[asyncio.AbstractEventLoop, PrefectClient] = {}


@asynccontextmanager
async def shared_client() -> AsyncIterator[PrefectClient]:
    """Open a Prefect client that :func:`client` lends to every call on this event loop
    until the block ends (the API's lifespan): one TLS context, one connection pool and
    one CSRF token per process instead of one per cancel or list."""
    loop = asyncio.get_running_loop()
    async with get_client() as opened:
        _shared[loop] = opened
        try:
            yield opened
        finally:
            _shared.pop(loop, None)


@asynccontextmanager
async def client() -> AsyncIterator[PrefectClient]:
    """This loop's shared client (see :func:`shared_client`), else a new one for the call."""
    lent = _shared.get(asyncio.get_running_loop())
    if lent is not None:
        yield lent
        return
    async with get_client() as opened:
        yield opened


@dataclass(frozen=True)
class RunToCreate:
    """What a request's flow run is made of."""

    request_id: str
    campaign_id: str
    org_id: int
    send_at: datetime


async def deployment_id(client: PrefectClient, name: str = DEPLOYMENT_FULL_NAME) -> UUID:
    """The id of a delivery deployment (``deliver-request/default`` unless ``name``) on the
    current server (cached per API URL)."""
    key = f"{PREFECT_API_URL.value()} {name}"
    cached = _deployment_ids.get(key)
    if cached is None:
        deployment = await client.read_deployment_by_name(name)
        cached = _deployment_ids[key] = deployment.id
    return cached


def forget_deployment_id() -> None:
    """Drop the cached id (after a server was replaced, or a 404)."""
    _deployment_ids.clear()


def run_tags(*, campaign_id: str, org_id: int) -> list[str]:
    return [f"campaign:{campaign_id}", f"org:{org_id}"]


# A SQLite-backed Prefect server refuses a run at once when another writer holds its
# database ("database is locked": its bulk route reads, then writes, in a deferred
# transaction); such runs are posted again after a short pause, then left in the outbox.
BUSY_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
_BUSY_SIGNS = ("database is locked", "database is busy")


def _is_busy(error: str) -> bool:
    return any(sign in error for sign in _BUSY_SIGNS)


def _short(error: str) -> str:
    """The first line of a server-side error, without the SQL and parameters it dumps."""
    return error.split("\n", 1)[0].split(" [SQL:", 1)[0][:300]


async def _post_bulk(
    client: PrefectClient, dep_id: UUID, runs: Sequence[RunToCreate]
) -> list[dict[str, Any]]:
    body = [
        {
            "name": run.request_id,
            "parameters": {"request_id": run.request_id},
            "state": {
                "type": "SCHEDULED",
                "name": "Scheduled",
                "state_details": {"scheduled_time": run.send_at.isoformat()},
            },
            "tags": run_tags(campaign_id=run.campaign_id, org_id=run.org_id),
            "idempotency_key": run.request_id,
        }
        for run in runs
    ]
    response = await client.request(
        "POST",
        "/deployments/{id}/create_flow_run/bulk",  # type: ignore[arg-type]
        path_params={"id": dep_id},
        json=body,
    )
    results: list[dict[str, Any]] = response.json()["results"]
    return results


async def create_runs(client: PrefectClient, runs: Sequence[RunToCreate]) -> dict[str, str]:
    """Create (or find, by idempotency key) the flow runs; request id -> flow run id.

    Uses the server's bulk route, at most ``BULK_LIMIT`` runs per call; runs the server
    refused because its database was busy are posted again (``BUSY_RETRY_DELAYS``).
    Requests whose run could not be created are missing from the answer (they stay in
    the outbox, and the next pass tries again).
    """
    created: dict[str, str] = {}
    dep_id = await deployment_id(client)
    for start in range(0, len(runs), BULK_LIMIT):
        pending = list(runs[start : start + BULK_LIMIT])
        for delay in (*BUSY_RETRY_DELAYS, None):
            busy: list[RunToCreate] = []
            results = await _post_bulk(client, dep_id, pending)
            for run, result in zip(pending, results, strict=True):
                error = str(result.get("error") or "")
                if result.get("status") == "CREATED" and result.get("flow_run_id"):
                    created[run.request_id] = str(result["flow_run_id"])
                elif _is_busy(error):
                    busy.append(run)
                else:
                    logger.warning("flow run not created for a request: %s", _short(error))
            if not busy or delay is None:
                break
            pending = busy
            await asyncio.sleep(delay)
        if busy:
            logger.info(
                "%d flow runs not created yet (the Prefect server was busy): they stay in "
                "the outbox for the next pass",
                len(busy),
            )
    return created


async def read_run(client: PrefectClient, flow_run_id: str) -> FlowRun:
    return await client.read_flow_run(UUID(flow_run_id))


async def claim(client: PrefectClient, flow_run_id: UUID | str, *, message: str) -> bool:
    """Scheduled -> Pending, refused by the server if someone else claimed it first."""
    result: OrchestrationResult[Any] = await client.set_flow_run_state(
        flow_run_id, Pending(message=message)
    )
    return result.status == SetStateStatus.ACCEPT


async def cancel_claimed(client: PrefectClient, flow_run_id: UUID | str, *, message: str) -> None:
    """Pending (claimed by us) -> Cancelled."""
    result: OrchestrationResult[Any] = await client.set_flow_run_state(
        flow_run_id, Cancelled(message=message)
    )
    if result.status != SetStateStatus.ACCEPT:
        await client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)


async def complete_cancelled_too_late(client: PrefectClient, flow_run_id: UUID | str) -> None:
    """Cancelling -> Completed, for a run whose request was processed before the cancel:
    nothing is left to stop, its report is written and announced. Forced: Prefect lets a
    Cancelling run end Cancelled only."""
    await client.set_flow_run_state(
        flow_run_id, Completed(message="Its request was processed before the cancel"), force=True
    )


async def cancel_if_scheduled(
    client: PrefectClient, flow_run_id: UUID | str, *, run: FlowRun | None = None
) -> bool:
    """The race-free cancel of prefect-facts.md: claim, then cancel. False if it started.

    ``run``: the run as the caller just read it, else read here (the claim is what is
    race-free, not the read)."""
    if run is None:
        run = await client.read_flow_run(UUID(str(flow_run_id)))
    state = run.state
    if state is None:
        return False
    if state.type in (StateType.CANCELLED, StateType.CANCELLING):
        return True
    if state.type == StateType.PENDING and state.message == CANCEL_CLAIM_MESSAGE:
        await cancel_claimed(client, flow_run_id, message="Cancelled by campaign-trigger")
        return True
    if state.type != StateType.SCHEDULED:
        return False
    if not await claim(client, flow_run_id, message=CANCEL_CLAIM_MESSAGE):
        return False
    await cancel_claimed(client, flow_run_id, message="Cancelled by campaign-trigger")
    return True


async def cancel_shares(client: PrefectClient, request_run_id: UUID) -> None:
    """End the share runs (``deliver-chunks`` subflows) of a request's run that was
    cancelled: one not claimed yet is cancelled at once (:func:`cancel_if_scheduled`), one
    claimed is set Cancelling, and its worker stops it. Prefect's own clean-up of a
    cancelled run's subflows comes up to 20 s later, and meanwhile any worker with room
    could claim a share and send its chunks."""
    while True:  # a page at a time; an ended share leaves the filter
        shares = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[request_run_id]),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(
                        any_=[
                            StateType.SCHEDULED,
                            StateType.PENDING,
                            StateType.RUNNING,
                            StateType.PAUSED,
                        ]
                    )
                ),
            ),
            limit=PAGE_LIMIT,
        )
        for share in shares:
            if not await cancel_if_scheduled(client, share.id, run=share):
                # Not forced: a share that ended since the read (one running sees its
                # request cancelled and ends Cancelled itself) keeps its end; the server
                # refuses Cancelling on an ended run.
                await client.set_flow_run_state(
                    share.id, Cancelling(message="Its request was cancelled")
                )
        if len(shares) < PAGE_LIMIT:
            return


async def stop_request_of_share(client: PrefectClient, parent_task_run_id: UUID) -> None:
    """Set Cancelling the request's run a share (its subflow, made by the task run
    ``parent_task_run_id``) belongs to, unless it has ended: its worker stops it."""
    parent = await client.read_task_run(parent_task_run_id)
    if parent.flow_run_id is None:
        return
    request_run = await client.read_flow_run(parent.flow_run_id)
    if request_run.state is None or request_run.state.type != StateType.RUNNING:
        return  # ended (a cancelled request's run ends its shares itself), or not begun
    await client.set_flow_run_state(
        request_run.id, Cancelling(message="A share of its chunks was cancelled")
    )


def scheduled_filter(
    *, dep_id: UUID, ids: Sequence[UUID] | None = None, due_before: datetime | None = None
) -> FlowRunFilter:
    return FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=[dep_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
        id=FlowRunFilterId(any_=list(ids)) if ids else None,
        next_scheduled_start_time=(
            FlowRunFilterNextScheduledStartTime(before_=due_before) if due_before else None
        ),
    )


async def scheduled_among(client: PrefectClient, run_ids: Sequence[str]) -> set[str]:
    """Which of ``run_ids`` (at most :data:`PAGE_LIMIT`) are Scheduled deliver-request runs.

    Asks the server's filter route as ``read_flow_runs`` does, but reads only each run's
    id from the answer: building the runs' models (their dates through pendulum) cost a
    third of the scheduled list's CPU."""
    if not run_ids:
        return set()
    ids = [UUID(run_id) for run_id in run_ids]
    wanted = scheduled_filter(dep_id=await deployment_id(client), ids=ids)
    response = await client.request(
        "POST",
        "/flow_runs/filter",
        json={
            "flow_runs": wanted.model_dump(mode="json", exclude_unset=True),
            "limit": PAGE_LIMIT,
        },
    )
    return {str(run["id"]) for run in response.json()}


async def due_runs(client: PrefectClient, *, before: datetime, limit: int) -> list[FlowRun]:
    """Scheduled deliver-request runs due before ``before``, earliest first."""
    dep_id = await deployment_id(client)
    return await client.read_flow_runs(
        flow_run_filter=scheduled_filter(dep_id=dep_id, due_before=before),
        sort=FlowRunSort.NEXT_SCHEDULED_START_TIME_ASC,
        limit=limit,
    )


async def runs_in_states(
    client: PrefectClient,
    *,
    states: list[StateType],
    ids: list[UUID] | None = None,
    names: list[str] | None = None,
) -> list[FlowRun]:
    """Delivery runs (of requests and of their chunks) in ``states`` (and, given
    ``names``, whose state has one of those names), the longest waiting first."""
    deployments = [
        await deployment_id(client),
        await deployment_id(client, CHUNKS_DEPLOYMENT_FULL_NAME),
    ]
    return await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=deployments),
            state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=states),
                name=FlowRunFilterStateName(any_=names) if names else None,
            ),
            id=FlowRunFilterId(any_=ids) if ids else None,
        ),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        limit=PAGE_LIMIT,
    )


async def online_workers(client: PrefectClient, *, pool: str) -> list[str]:
    """Names of the workers of ``pool`` that Prefect counts online (recent heartbeats)."""
    workers = await client.read_workers_for_work_pool(
        pool,
        worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=[WorkerStatus.ONLINE])),
    )
    return sorted(worker.name for worker in workers)


def run_url(flow_run_id: str) -> str | None:
    """The flow run's page in the Prefect UI (None when no Prefect server is configured)."""
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    return f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}" if ui else None
