"""When a worker starts a run it claimed: ``START_AHEAD_SECONDS`` before its scheduled time
(Prefect's server then lets it run at once, where a run started on its claim was told to
wait whole seconds), at once if it is due or was taken over."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prefect.client.schemas.objects import FlowRun

from campaign_trigger.deployments.worker import START_AHEAD_SECONDS, until_start


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What ``until_start`` sleeps, without sleeping."""
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return delays


def _run(scheduled_in: float | None) -> FlowRun:
    when = None if scheduled_in is None else datetime.now(UTC) + timedelta(seconds=scheduled_in)
    return FlowRun(flow_id=uuid.uuid4(), next_scheduled_start_time=when)


async def test_a_run_scheduled_ahead_starts_just_before_its_time(slept: list[float]) -> None:
    started = time.time()
    await until_start(_run(1.5))
    [delay] = slept
    assert 1.5 - START_AHEAD_SECONDS - (time.time() - started) - 0.05 < delay
    assert delay <= 1.5 - START_AHEAD_SECONDS
    assert START_AHEAD_SECONDS < 0.5  # the server lets a run start no earlier than that


@pytest.mark.parametrize("scheduled_in", [0.2, -3.0, None], ids=["due", "late", "taken over"])
async def test_a_run_due_or_taken_over_starts_at_once(
    slept: list[float], scheduled_in: float | None
) -> None:
    await until_start(_run(scheduled_in))
    assert sum(slept) == 0
