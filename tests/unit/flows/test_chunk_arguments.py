"""What a chunk task is given: the plan without the request's recorded chunks, which it
does not use and Prefect would walk on every chunk task run (a gigabyte's late shares
read plans of ~5,000 recorded chunks: ~30 ms a chunk task)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from campaign_trigger.flows import deliver
from campaign_trigger.services.delivery_run import DeliveryPlan
from delivery_support import plan_of


class _ChunkTask:
    """Stands for the ``deliver chunk`` task: records what each run is given."""

    def __init__(self) -> None:
        self.given: list[tuple[DeliveryPlan, int]] = []

    def with_options(self, **options: Any) -> _ChunkTask:
        return self

    async def __call__(self, plan: DeliveryPlan, chunk_no: int) -> None:
        self.given.append((plan, chunk_no))


async def test_chunk_tasks_are_given_the_plan_without_its_recorded_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunk_task = _ChunkTask()
    monkeypatch.setattr(deliver, "deliver_chunk", chunk_task)
    plan = plan_of(5_130, chunk_size=5_000, recorded=frozenset(range(5_000)))
    await deliver._deliver_here(plan, [5_000, 5_001], progress=False)
    assert [n for _, n in chunk_task.given] == [5_000, 5_001]
    for given, _ in chunk_task.given:
        assert given.recorded == set()
        assert dataclasses.replace(given, recorded=plan.recorded) == plan  # all else kept
    assert plan.recorded == set(range(5_000))  # the request's own plan untouched
