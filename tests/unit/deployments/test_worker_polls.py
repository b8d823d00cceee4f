"""When a delivery worker polls its queue: every tick while shares are due to its process
(a request of its own fanning out, or a share running), every ``idle_poll_factor``-th
tick else, never while every slot is taken, and at least every ``KEEP_READY_SECONDS``
whatever the rest."""

from __future__ import annotations

import asyncio
import time
import uuid

import anyio
import pytest

from campaign_trigger.deployments.worker import KEEP_READY_SECONDS, DeliveryWorker, shares_due
from campaign_trigger.flows import fan_out


def _just_polled(*, busy: bool, slots: int = 2, taken: int = 0) -> DeliveryWorker:
    worker = DeliveryWorker(
        concurrency=slots, queue="chunks", idle_poll_factor=4, shares_due=lambda: busy
    )
    worker._limiter = anyio.CapacityLimiter(slots)
    for n in range(taken):
        worker._limiter.acquire_on_behalf_of_nowait(n)
    worker._polled = time.monotonic()
    return worker


def _ticks(worker: DeliveryWorker, count: int) -> list[bool]:
    return [worker.worth_polling() for _ in range(count)]


async def test_a_process_without_shares_due_polls_every_fourth_tick() -> None:
    assert _ticks(_just_polled(busy=False), 8) == [False, False, False, True] * 2


async def test_a_process_with_shares_due_polls_at_every_tick() -> None:
    assert _ticks(_just_polled(busy=True, taken=1), 4) == [True] * 4


async def test_a_worker_with_every_slot_taken_does_not_poll() -> None:
    assert _ticks(_just_polled(busy=True, taken=2), 8) == [False] * 8


async def test_a_queue_unpolled_for_too_long_is_polled_whatever_the_rest() -> None:
    worker = _just_polled(busy=True, taken=2)
    worker._polled = time.monotonic() - KEEP_READY_SECONDS
    assert worker.worth_polling()


async def test_shares_are_due_while_a_request_fans_out_or_a_share_runs_not_for_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests = DeliveryWorker(concurrency=4, queue="default")
    chunks = DeliveryWorker(concurrency=2, queue="chunks")
    workers = [requests, chunks]
    requests.active[uuid.uuid4()] = asyncio.current_task()  # type: ignore[assignment]
    assert not shares_due(workers)  # a request of one run: the chunks queue idles
    monkeypatch.setattr(fan_out, "fanning_out", {"r-1"})
    assert shares_due(workers)
    monkeypatch.setattr(fan_out, "fanning_out", set())
    chunks.active[uuid.uuid4()] = asyncio.current_task()  # type: ignore[assignment]
    assert shares_due(workers)
