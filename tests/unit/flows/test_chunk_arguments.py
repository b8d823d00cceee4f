"""What a chunk task run is given: the request's plan itself, which Prefect does not walk.

Prefect walks a task's arguments before each run, looking for futures and states to wait
for. The plan holds neither, and walking it cost ~0.4 ms a chunk task run (a gigabyte's
late shares, with plans of ~5,000 recorded chunks, ~30 ms)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from campaign_trigger.flows import deliver
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks.delivery import deliver_chunk
from delivery_support import plan_of
from support import ManagedProcess


class _Watched(set[int]):
    """Recorded chunks that count how often anything walks them."""

    walks = 0

    def __iter__(self) -> Iterator[int]:
        _Watched.walks += 1
        return super().__iter__()


async def test_chunk_task_runs_are_given_the_plan_itself_and_prefect_does_not_walk_it(
    monkeypatch: pytest.MonkeyPatch, prefect_server: ManagedProcess
) -> None:
    given: list[tuple[DeliveryPlan, int]] = []

    async def body(plan: DeliveryPlan, chunk_no: int) -> None:
        given.append((plan, chunk_no))

    # The real task (its options, its run name), running this body instead of a delivery.
    monkeypatch.setattr(deliver_chunk, "fn", body)
    plan = plan_of(5_130, chunk_size=5_000)
    plan.recorded = _Watched(range(5_000))
    await deliver._deliver_here(plan, [5_000, 5_001], progress=False)
    assert [n for _, n in given] == [5_000, 5_001]
    assert all(handed is plan for handed, _ in given)
    assert _Watched.walks == 0
