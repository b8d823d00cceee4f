"""When a delivery worker polls its queue: every tick while its process runs something,
every ``idle_poll_factor``-th tick while it runs nothing, never while every slot is taken,
and at least every ``KEEP_READY_SECONDS`` whatever the rest."""

from __future__ import annotations

import time

import anyio

from campaign_trigger.deployments.worker import KEEP_READY_SECONDS, DeliveryWorker


def _just_polled(*, busy: bool, slots: int = 2, taken: int = 0) -> DeliveryWorker:
    worker = DeliveryWorker(
        concurrency=slots, queue="chunks", idle_poll_factor=4, process_busy=lambda: busy
    )
    worker._limiter = anyio.CapacityLimiter(slots)
    for n in range(taken):
        worker._limiter.acquire_on_behalf_of_nowait(n)
    worker._polled = time.monotonic()
    return worker


def _ticks(worker: DeliveryWorker, count: int) -> list[bool]:
    return [worker.worth_polling() for _ in range(count)]


async def test_an_idle_process_polls_every_fourth_tick() -> None:
    assert _ticks(_just_polled(busy=False), 8) == [False, False, False, True] * 2


async def test_a_busy_process_polls_at_every_tick() -> None:
    assert _ticks(_just_polled(busy=True, taken=1), 4) == [True] * 4


async def test_a_worker_with_every_slot_taken_does_not_poll() -> None:
    assert _ticks(_just_polled(busy=True, taken=2), 8) == [False] * 8


async def test_a_queue_unpolled_for_too_long_is_polled_whatever_the_rest() -> None:
    worker = _just_polled(busy=True, taken=2)
    worker._polled = time.monotonic() - KEEP_READY_SECONDS
    assert worker.worth_polling()
