"""Waking a worker's queue when a run is scheduled in it, instead of polling every tick;
and its cancel watch and dead-run sweep when a run of the pool is cancelled or marked
dead, instead of looking every 2 s.

A poll of the pool costs the Prefect server ~23 ms of CPU (docs/benchmarks.md), so a
worker polling its request queue every 0.5 s cost an idle server ~46 ms a second, and
every idle worker more. The server announces each run it schedules as a
``prefect.flow-run.Scheduled`` event (or ``Late``, ``AwaitingRetry``...), naming the
run's pool and queue among its related resources. One subscription per worker process
(Prefect's event stream, a websocket) marks the queue woken
(:meth:`DeliveryWorker.wake`), and the queue is polled at once (wakes poll at most
every ``poll_seconds``).
The event does not say when the run is due: after an event the worker looks up the
earliest run still scheduled in the queue (one read), and polls as that run comes
within its prefetch; between events an idle worker sends the server nothing but its
heartbeats and a poll every ``KEEP_READY_SECONDS`` (:meth:`DeliveryWorker.next_step`).
Each subscription wakes every queue once, for the runs scheduled while there was none.
Without the stream a queue is polled every ``IDLE_POLL_FACTOR``-th tick, which also
picks up runs scheduled ahead as their time comes (the worker's prefetch covers that
interval).

The same subscription receives the pool's runs set ``Cancelling`` (the UI's Cancel) and
marked dead (``prefect_runs.DEAD_RUN_STATE_NAME``, by the dead-run automation): each
makes the upkeep's cancel watch or dead-run sweep look at once (``upkeep.Sweeps``),
which otherwise look every ``upkeep.FALLBACK_SECONDS`` while the stream is up and every
``upkeep.NO_STREAM_SECONDS`` while it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter
from prefect.events.schemas.events import Event

from campaign_trigger.deployments import catalog
from campaign_trigger.deployments.upkeep import Sweeps
from campaign_trigger.services import prefect_runs

if TYPE_CHECKING:
    from campaign_trigger.deployments.worker import DeliveryWorker

logger = logging.getLogger(__name__)

# A run's state events are named after its state: every name Prefect gives a run that
# waits for a worker (created, late, a retry, resumed from a pause, waiting for a slot).
SCHEDULED = [
    f"prefect.flow-run.{name}"
    for name in ("Scheduled", "Late", "AwaitingRetry", "Resuming", "AwaitingConcurrencySlot")
]
CANCELLING = "prefect.flow-run.Cancelling"
DEAD = f"prefect.flow-run.{prefect_runs.DEAD_RUN_STATE_NAME}"
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


def dispatch(event: Event, by_queue: Mapping[str, DeliveryWorker], sweeps: Sweeps) -> None:
    """Act on an event of a run of a queue this process serves (``by_queue``: its worker
    of each): a run scheduled wakes its queue, one cancelling or marked dead wakes the
    cancel watch or the sweep."""
    worker = by_queue.get(queue_of(event) or "")
    if worker is None:
        return
    if event.event == CANCELLING:
        sweeps.cancelling.set()
    elif event.event == DEAD:
        sweeps.dead.set()
    else:
        worker.wake()


async def wake_on_events(
    workers: Iterable[DeliveryWorker], sweeps: Sweeps, stop: asyncio.Event
) -> None:
    """Act on the runs' events (:func:`dispatch`) until ``stop``; if the event stream
    fails, subscribe again after ``RESUBSCRIBE_SECONDS`` (meanwhile the queues are polled
    at their idle pace, and the sweeps look every ``upkeep.NO_STREAM_SECONDS``)."""
    by_queue = {worker.queue: worker for worker in workers}
    names = EventNameFilter(name=[*SCHEDULED, CANCELLING, DEAD])  # type: ignore[call-arg]
    while not stop.is_set():
        try:
            async with get_events_subscriber(filter=EventFilter(event=names)) as subscriber:
                sweeps.stream_up = True
                for worker in by_queue.values():
                    worker.events_up = True
                    worker.wake()
                async for event in subscriber:
                    dispatch(event, by_queue, sweeps)
        except Exception as exc:  # the server is restarting, or has no event stream
            logger.warning("run events unavailable (%r): polling at idle pace", exc)
        finally:
            sweeps.stream_up = False
            for worker in by_queue.values():
                worker.events_up = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=RESUBSCRIBE_SECONDS)
