"""The cancel watch's end of cancelled runs no worker executes (``upkeep._end_unexecuted``):
one run that cannot be read does not hold back the others."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

import httpx
import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelling, Pending

from campaign_trigger.deployments import upkeep
from campaign_trigger.services import prefect_runs

WORKER = "ct-worker-test-default"


class _Worker:
    """What the watch asks of a worker: its name, and whether it executes a run."""

    name = WORKER

    def executes(self, flow_run_id: UUID) -> bool:
        return False


class _Client:
    """The states of each run (claimed by ``WORKER``); reading the first run's fails."""

    def __init__(self, failing: UUID | None = None, claimer: str = WORKER) -> None:
        self.failing = failing
        self.claimer = claimer
        self.reads: list[UUID] = []

    async def read_flow_run_states(self, flow_run_id: UUID) -> list[Any]:
        self.reads.append(flow_run_id)
        if flow_run_id == self.failing:
            raise httpx.ReadTimeout("the server did not answer")
        return [Pending(message=f"{prefect_runs.WORKER_CLAIM_PREFIX}{self.claimer}"), Cancelling()]


async def test_a_run_that_cannot_be_read_does_not_hold_back_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = [FlowRun(flow_id=uuid.uuid4(), state=Cancelling()) for _ in range(2)]
    ended: list[tuple[UUID, str | None]] = []

    async def cancelling(client: object, **filters: object) -> list[FlowRun]:
        return runs

    async def finish_cancel(client: object, run: FlowRun, *, message: str) -> None:
        ended.append((run.id, message))

    monkeypatch.setattr(prefect_runs, "runs_in_states", cancelling)
    monkeypatch.setattr(upkeep, "finish_cancel", finish_cancel)
    client: Any = _Client(failing=runs[0].id)
    workers: Any = [_Worker()]
    await upkeep._end_unexecuted(workers, client)
    assert ended == [(runs[1].id, "Cancelled before its start")]


async def test_a_run_left_to_another_worker_has_its_claimer_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cancelling, claimed by a worker of another process, younger than the dead-run limit:
    # left to that worker at every look. Its claimer was read again at each one (a call
    # to the Prefect server per such run per look).
    runs = [FlowRun(flow_id=uuid.uuid4(), state=Cancelling())]
    ended: list[UUID] = []

    async def cancelling(client: object, **filters: object) -> list[FlowRun]:
        return runs

    async def finish_cancel(client: object, run: FlowRun, *, message: str) -> None:
        ended.append(run.id)

    monkeypatch.setattr(prefect_runs, "runs_in_states", cancelling)
    monkeypatch.setattr(upkeep, "finish_cancel", finish_cancel)
    client: Any = _Client(claimer="ct-worker-elsewhere-default")
    workers: Any = [_Worker()]
    for _ in range(3):
        await upkeep._end_unexecuted(workers, client)
    assert client.reads == [runs[0].id]
    assert ended == []
    runs.clear()  # it ended: forgotten at the next look
    await upkeep._end_unexecuted(workers, client)
    assert upkeep._claimers == {}
