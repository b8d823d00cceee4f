"""Waking a worker's queue when a run is scheduled in it, instead of polling every tick.

A poll of the pool costs the Prefect server ~23 ms of CPU (docs/benchmarks.md), so a
worker polling its request queue every 0.5 s cost an idle server ~46 ms a second, and
every idle worker more. The server announces each run it schedules as a
``prefect.flow-run.Scheduled`` event (or ``Late``, ``AwaitingRetry``...), naming the
run's pool and queue among its related resources. One subscription per worker process
(Prefect's event stream, a websocket) marks the queue woken
(:meth:`DeliveryWorker.wake`), and the queue is polled at once (wakes poll at most
every ``poll_seconds``).
Without an event a queue is polled every ``IDLE_POLL_FACTOR``-th tick, which also picks
up runs scheduled ahead as their time comes (the worker's prefetch covers that
interval) and runs whose event was missed while the stream was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter
from prefect.events.schemas.events import Event

from campaign_trigger.deployments import catalog

if TYPE_CHECKING:
    from campaign_trigger.deployments.worker import DeliveryWorker

logger = logging.getLogger(__name__)

# A run's state events are named after its state: every name Prefect gives a run that
# waits for a worker (created, late, a retry, resumed from a pause, waiting for a slot).
SCHEDULED = [
    f"prefect.flow-run.{name}"
    for name in ("Scheduled", "Late", "AwaitingRetry", "Resuming", "AwaitingConcurrencySlot")
]
RESUBSCRIBE_SECONDS = 5.0


def queue_of(event: Event) -> str | None:
    """The queue of the delivery pool the event's run is scheduled in, if any."""
    pool = queue = None
    for resource in event.related:
        if resource.role == "work-pool":
            pool = resource.name
        elif resource.role == "work-queue":
            queue = resource.name
    return queue if pool == catalog.DELIVERY_POOL else None


async def wake_on_scheduled(workers: Iterable[DeliveryWorker], stop: asyncio.Event) -> None:
    """Wake the worker of each queue a run is scheduled in, until ``stop``; if the event
    stream fails, subscribe again after ``RESUBSCRIBE_SECONDS`` (meanwhile the queues are
    polled at their idle pace)."""
    by_queue = {worker.queue: worker for worker in workers}
    only_scheduled = EventFilter(event=EventNameFilter(name=SCHEDULED))  # type: ignore[call-arg]
    while not stop.is_set():
        try:
            async with get_events_subscriber(filter=only_scheduled) as subscriber:
                async for event in subscriber:
                    worker = by_queue.get(queue_of(event) or "")
                    if worker is not None:
                        worker.wake()
        except Exception as exc:  # the server is restarting, or has no event stream
            logger.warning("scheduled-run events unavailable (%r): polling at idle pace", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=RESUBSCRIBE_SECONDS)
