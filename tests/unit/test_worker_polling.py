"""How often a delivery worker polls its pool: less while polls find nothing."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from prefect.workers.base import BaseWorker

from campaign_trigger.deployments import worker as worker_module
from campaign_trigger.deployments.worker import IDLE_POLL_SECONDS, DeliveryWorker


async def _ticks(
    monkeypatch: pytest.MonkeyPatch, finds: dict[int, list[Any]], ticks: int
) -> list[float]:
    """Call the worker's poll every 0.5 s (as Prefect's loop does) on a fake clock; the
    times it asked the server, whose answer at poll n is ``finds.get(n, [])``."""
    now = [0.0]
    asked: list[float] = []

    async def server_poll(self: BaseWorker[Any, Any, Any]) -> list[Any]:
        asked.append(now[0])
        return finds.get(len(asked), [])

    monkeypatch.setattr(worker_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(BaseWorker, "get_and_submit_flow_runs", server_poll)
    worker = DeliveryWorker(concurrency=1, poll_seconds=0.5)
    for tick in range(ticks):
        now[0] = tick * 0.5
        await worker.get_and_submit_flow_runs()
    return asked


async def test_an_idle_worker_polls_every_idle_poll_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = await _ticks(monkeypatch, {}, ticks=40)  # 20 s with nothing to run
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[:2] == [1.0, 2.0]
    assert set(gaps[2:]) == {IDLE_POLL_SECONDS}
    assert len(asked) == 11  # instead of 40


async def test_a_poll_that_finds_a_run_brings_the_poll_interval_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = await _ticks(monkeypatch, {5: ["a run"], 6: ["a run"]}, ticks=40)
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[4:7] == [0.5, 0.5, 1.0]  # after each poll that found a run, the next tick
