"""What a delivery worker process does beside Prefect's own worker loops.

* the outbox reconciler (``services.scheduling.run_reconciler``);
* the completion webhooks' sender (``services.webhook_sender.run_sender``);
* stopping a run of this worker cancelled while running, or while it waits for its time
  (the UI's Cancel: Cancelling), and ending one cancelled that no worker executes;
* taking over the runs of dead workers. Liveness is Prefect's: every run sends
  flow-run heartbeats, and the automation ``register.ZOMBIE_AUTOMATION`` marks a run
  Crashed, named ``prefect_runs.DEAD_RUN_STATE_NAME``, when they stop. A worker with a
  free slot claims such a run (Crashed -> Pending: accepted once, a second worker's
  claim is refused) and runs it; the flow skips what the dead worker recorded. If the
  taker dies too, its run stops heartbeating and is marked dead again. A run a cancel
  had claimed is cancelled instead.

The cancel watch and the dead-run sweep look at once when the server announces a run of
the pool Cancelling or marked dead (its state events, which the worker process's event
subscription receives: ``wakeup.py``, :class:`Sweeps`), and otherwise every
``FALLBACK_SECONDS``, for an event missed while the subscription reconnected; every
``NO_STREAM_SECONDS`` while the worker has no event stream. Each look is a read of the
Prefect server: the sweep used to read every 2 s on every worker process, idle or not
(docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun, StateType

from campaign_trigger.config import get_settings
from campaign_trigger.deployments import catalog, register
from campaign_trigger.services import (
    delivery_run,
    prefect_runs,
    request_states,
    scheduling,
    webhook_sender,
)
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request, RequestState

if TYPE_CHECKING:
    from campaign_trigger.deployments.worker import DeliveryWorker

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

FALLBACK_SECONDS = 10.0
NO_STREAM_SECONDS = 2.0
AGAIN_SECONDS = 1.0  # a look an event woke is made once more this much later
# The API drains the outbox as it accepts a request; a worker's drain is for the requests
# it could not (Prefect away, the API stopped between its commit and its drain), or that
# this process accepted itself. Each drain is a read of the outbox in a thread: every
# 0.5 s (a tick) they were a third of an idle worker's CPU (docs/benchmarks.md).
RECONCILE_SECONDS = 1.0


@dataclass
class Sweeps:
    """What makes the cancel watch and the dead-run sweep look now: a run of the pool
    announced Cancelling (``cancelling``) or marked dead (``dead``); whether the worker
    process receives the server's events (``stream_up``) sets their pace without one."""

    cancelling: asyncio.Event = field(default_factory=asyncio.Event)
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    stream_up: bool = False

    def interval(self) -> float:
        return FALLBACK_SECONDS if self.stream_up else NO_STREAM_SECONDS


def _request_of(run: FlowRun) -> str:
    return str(run.parameters.get("request_id", ""))


def _worker_of(message: str | None) -> str | None:
    if message and message.startswith(prefect_runs.WORKER_CLAIM_PREFIX):
        return message.removeprefix(prefect_runs.WORKER_CLAIM_PREFIX).split(" ", 1)[0]
    return None


async def own_run(run: FlowRun, *, owner: str) -> None:
    """Note on the request which worker claimed its run."""

    def write() -> None:
        with session_scope() as session:
            delivery_run.own_run(session=session, request_id=_request_of(run), owner=owner)

    await asyncio.to_thread(write)


async def finish_cancel(
    client: PrefectClient, run: FlowRun, *, message: str = "Cancelled by campaign-trigger"
) -> None:
    """The run is Cancelled, and so is its request, as a whole: a request's run ends its
    shares, and a share cancelled on its own (the UI's *Cancel* on it) stops its
    request's run, which then ends the others. A run whose request was processed before
    the cancel completes instead (:func:`cancel_unless_processed`)."""
    # The request before the run and its shares: one who saw the run Cancelled finds it
    # cancelled too, and a share claimed from now on sends nothing.
    if not await cancel_unless_processed(client, run):
        return
    await prefect_runs.cancel_claimed(client, run.id, message=message)
    if "chunk_nos" not in run.parameters:  # a request's run, not a share of its chunks
        await prefect_runs.cancel_shares(client, run.id)
    elif run.parent_task_run_id is not None:
        await prefect_runs.stop_request_of_share(client, run.parent_task_run_id)


async def cancel_unless_processed(
    client: PrefectClient, run: FlowRun, *, goes_on: bool = False
) -> bool:
    """Mark the run's request (a share's: the request it is part of) canceled unless it
    is processed; whether it is canceled. One update decides against the report's
    (``set_state`` never leaves either). A cancel that comes after the report (the UI's
    *Cancel* as the run ends) has nothing left to stop: the request stays processed, and
    its run is completed here (:func:`prefect_runs.complete_cancelled_too_late`), not
    Cancelled after request.processed was announced.

    ``goes_on``: the run executes here and goes on unless stopped. If every chunk of its
    request is recorded, nothing is left to stop either: it is left to write the report,
    and its end completes it (the request used to end canceled with every message sent).
    A chunk recorded between this read and the update is not seen: the cancel then stops
    a run that had only its report left."""

    def write() -> bool | None:
        with session_scope() as session:
            request_id = _request_of(run)
            if goes_on and delivery_run.delivered(session=session, request_id=request_id):
                return None
            request_states.set_state(
                session=session, request_id=request_id, state=RequestState.canceled
            )
            request = session.get(Request, request_id)
            return request is None or request.state != RequestState.processed

    canceled = await asyncio.to_thread(write)
    if canceled is None:
        logger.info("run %s was cancelled after every chunk was sent: its report goes on", run.id)
        return False
    if canceled:
        return True
    logger.warning("run %s was cancelled after its request was processed", run.id)
    await prefect_runs.complete_cancelled_too_late(client, run.id)
    return False


async def until_prefect_answers(
    action: Callable[[], Awaitable[_T]], stop: asyncio.Event
) -> _T | None:
    """Run ``action`` until it succeeds (the Prefect server may still be starting): its
    result, or None if ``stop`` was set first."""
    delay = 0.5
    while not stop.is_set():
        try:
            return await action()
        except Exception as exc:
            logger.warning("Prefect not ready yet: %r", exc)
            await _sleep(stop, delay)
            delay = min(delay * 2, 10.0)
    return None


async def watch_again_once_loaded(
    registered: register.Registered,
    stop: asyncio.Event,
    *,
    after: float = register.AUTOMATION_LOADED_SECONDS,
) -> None:
    """If ``registered``'s start created the dead-run automation: ``after`` seconds on
    (unless ``stop`` is set first), once the Prefect server has surely loaded it, watch the
    runs claimed again (a run already watched is left as it is). Their first watch may have
    reached the server before the automation did, and a run whose worker died before it
    would then never be marked dead. A failure is logged: the runs keep their first
    watch."""
    if not registered.automation_created:
        return
    await _sleep(stop, after)
    if stop.is_set():
        return
    try:
        async with get_client() as client:
            watched = await register.watch_claimed_runs(client, registered.deployment_ids)
    except Exception as exc:
        logger.warning("runs claimed not watched again by the new dead-run automation: %r", exc)
        return
    logger.info(
        "runs claimed, watched again now that the dead-run automation is loaded: %d", watched
    )


async def stop_cancelled_runs(workers: list[DeliveryWorker], client: PrefectClient) -> None:
    """Runs set Cancelling (the UI's Cancel on a started run, or on one claimed and waiting
    for its time, ``worker.until_start``; a cancelled request's shares): those this
    process's workers execute are stopped; those nobody executes are ended Cancelled
    (:func:`_end_unexecuted`).

    The messages in flight are abandoned (their outcomes are not recorded); the run ends
    Cancelled and the request is mirrored as canceled.
    """
    if active := [run_id for worker in workers for run_id in worker.active]:
        await _stop_cancelled(workers, client, active)
    await _end_unexecuted(workers, client)


async def _stop_cancelled(
    workers: list[DeliveryWorker], client: PrefectClient, active: list[UUID]
) -> None:
    """Stop the runs of ``active`` (executed here) set Cancelling."""
    runs = await prefect_runs.runs_in_states(client, states=[StateType.CANCELLING], ids=active)
    for run in runs:
        # The request is marked canceled before the stop, whose Crashed and crash hook then
        # leave it so; unless it was processed, or sent and its report being written: the
        # run completes, as it is about to.
        if not await cancel_unless_processed(client, run, goes_on=True):
            continue
        tasks = [t for t in (w.stop_run(run.id) for w in workers) if t is not None]
        if not tasks:
            continue
        when = _when(run)
        logger.warning("run %s was cancelled %s: stopping it", run.id, when)
        await asyncio.gather(tasks[0], return_exceptions=True)
        await finish_cancel(client, run, message=f"Cancelled {when}")


def _when(run: FlowRun) -> str:
    """When the run was cancelled: a run claimed ahead of its time waits for it in its
    worker, not yet Running."""
    return "while running" if run.start_time is not None else "before its start"


# The claimer of each run Cancelling at the watch's last look (a Cancelling run is never
# claimed again: Prefect refuses it Pending): read once, not at every look while another
# process's run waits for its worker to stop it or for the dead-run limit.
_claimers: dict[UUID, str | None] = {}


async def _end_unexecuted(workers: list[DeliveryWorker], client: PrefectClient) -> None:
    """End Cancelled the cancelled runs no worker executes: claimed by a worker of this
    process whose execution of it failed before Prefect's engine ended it; or claimed by
    a worker Prefect counts offline, and Cancelling for longer than the dead-run limit
    (``CT_DEAD_RUN_AFTER_SECONDS``: a worker alive stops its run within seconds; one
    frozen or cut off that long exits before it sends again, as when its runs are taken
    over). No one else ends them in time: the dead-run automation counts Cancelling as
    at rest, and Prefect's cancellation clean-up forces them Cancelled only after five
    minutes, without asking whether their requests were processed."""
    runs = await prefect_runs.runs_in_states(client, states=[StateType.CANCELLING])
    ours = {worker.name for worker in workers}
    limit = timedelta(seconds=get_settings().dead_run_after_seconds)
    online: set[str] | None = None
    for gone in _claimers.keys() - {run.id for run in runs}:
        del _claimers[gone]
    for run in runs:
        if run.state is None or any(worker.executes(run.id) for worker in workers):
            continue
        try:  # one run that cannot be read or ended does not hold back the others
            if run.id not in _claimers:
                _claimers[run.id] = _worker_of(await _claimer(client, run))
            claimer = _claimers[run.id]
            if claimer is None:  # not claimed by a worker: a cancel's claim ends it itself
                continue
            if claimer not in ours:
                if run.state.timestamp > datetime.now(UTC) - limit:
                    continue
                if online is None:
                    pool = catalog.DELIVERY_POOL
                    online = set(await prefect_runs.online_workers(client, pool=pool))
                if claimer in online:
                    continue
            logger.warning("run %s, cancelled, is executed by no worker: ending it", run.id)
            await finish_cancel(client, run, message=f"Cancelled {_when(run)}")
        except Exception as exc:
            logger.warning("run %s, cancelled: not ended this time: %r", run.id, exc)


async def _claimer(client: PrefectClient, run: FlowRun) -> str | None:
    """The message of the run's latest Pending state: who claimed it."""
    states = await client.read_flow_run_states(run.id)
    pending = [s for s in states if s.type == StateType.PENDING]
    return pending[-1].message if pending else None


async def retake_dead_runs(workers: list[DeliveryWorker], client: PrefectClient) -> int:
    """Take over the runs Prefect marked dead, while the worker of their queue has free
    slots."""
    by_queue = {worker.queue: worker for worker in workers}
    taken = 0
    dead = await prefect_runs.runs_in_states(
        client, states=[StateType.CRASHED], names=[prefect_runs.DEAD_RUN_STATE_NAME]
    )
    for run in dead:  # (a run crashed for another reason failed: it is not asked for)
        worker = by_queue.get(run.work_queue_name or "default")
        if worker is None:
            continue
        if await _claimer(client, run) == prefect_runs.CANCEL_CLAIM_MESSAGE:
            await finish_cancel(client, run)
            continue
        if await worker.take_over(run):
            logger.warning("run %s of a dead worker: taken over", run.id)
            taken += 1
    return taken


async def every(
    interval: Callable[[], float],
    stop: asyncio.Event,
    what: str,
    step: Callable[[PrefectClient], Awaitable[object]],
    *,
    woken: asyncio.Event,
) -> None:
    """``step`` at once, then each time ``woken`` is set or ``interval()`` seconds after
    the last, until ``stop``. A wake during a step makes another step right after it; a
    step a wake started is made again ``AGAIN_SECONDS`` later (an event can reach the
    worker before the server answers reads with the state it announced)."""
    was_woken = False
    async with get_client() as client:
        while not stop.is_set():
            woken.clear()
            try:
                await step(client)
            except Exception as exc:
                logger.warning("%s failed: %r", what, exc)
            pause = min(interval(), AGAIN_SECONDS) if was_woken else interval()
            await _sleep(stop, pause, woken)
            was_woken = woken.is_set()


async def run_loops(
    workers: list[DeliveryWorker],
    *,
    stop: asyncio.Event,
    reconcile: bool,
    sweeps: Sweeps,
) -> None:
    """The upkeep loops of a worker process, until ``stop``; the cancel watch and the
    dead-run sweep also when ``sweeps`` says so."""
    loops = [
        every(
            sweeps.interval,
            stop,
            "cancel watch",
            lambda c: stop_cancelled_runs(workers, c),
            woken=sweeps.cancelling,
        ),
        every(
            sweeps.interval,
            stop,
            "dead-run sweep",
            lambda c: retake_dead_runs(workers, c),
            woken=sweeps.dead,
        ),
        webhook_sender.run_sender(sessions=session_scope, settings=get_settings(), stop=stop),
    ]
    if reconcile:
        loops.append(
            scheduling.run_reconciler(sessions=session_scope, stop=stop, interval=RECONCILE_SECONDS)
        )
    await asyncio.gather(*loops)


async def _sleep(stop: asyncio.Event, seconds: float, woken: asyncio.Event | None = None) -> None:
    """``seconds``, or less if ``stop`` (or ``woken``) is set meanwhile."""
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, woken) if event is not None]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
