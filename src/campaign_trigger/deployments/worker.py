"""``campaign-trigger worker``: a Prefect worker of the pool ``campaign-trigger-delivery``.

:class:`DeliveryWorker` is a ``BaseWorker`` of type ``campaign-trigger``: Prefect's own
loops poll the pool (a paused pool or a pool/queue concurrency limit stops the server
from handing out runs), send the worker's heartbeats (the Work Pools page shows it
online), and watch cancellations. What differs from Prefect's process worker is
where a run executes: in this process, with ``run_flow_async``, several at a time on
one event loop, so no process starts per run (~2 s and ~90 MiB each).

Submission is lean: the server's race-free claim (Scheduled -> Pending, refused if
another worker or a cancel got there first, with a message naming this worker, and
the request's ``run_owner``), then the run; none of the process worker's extra calls
(deployment, flow and pool reads, labels, a Submitting state, the infrastructure id),
each of which costs the Prefect server CPU on every request.

Beside Prefect's loops the process runs :mod:`campaign_trigger.deployments.upkeep`:
the outbox reconciler, stopping runs cancelled while running, and taking over the
runs Prefect marked dead (:meth:`DeliveryWorker.take_over`); and one watch for runs
suspended in the UI for all its runs (:mod:`campaign_trigger.deployments.suspension`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Self
from uuid import UUID

import anyio
import anyio.abc
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkPoolFilter,
    WorkPoolFilterName,
    WorkQueueFilter,
    WorkQueueFilterName,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import AsyncClientContext
from prefect.flow_engine import run_flow_async
from prefect.flows import Flow
from prefect.settings import (
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_WORKER_QUERY_SECONDS,
    temporary_settings,
)
from prefect.settings.legacy import Setting
from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorker, BaseWorkerResult

from campaign_trigger import heap, logs, metrics
from campaign_trigger.config import get_settings
from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.providers import close_providers
from campaign_trigger.deployments import (
    catalog,
    heartbeats,
    register,
    suspension,
    upkeep,
    wakeup,
)
from campaign_trigger.deployments.prefect_ssl import share_prefect_ssl_contexts
from campaign_trigger.flows import fan_out
from campaign_trigger.services import prefect_runs, render
from campaign_trigger.services.delivering import sleep_until

logger = logging.getLogger("campaign_trigger.deployments.worker")
# While the worker has no event stream a queue is polled every IDLE_POLL_FACTOR[queue]-th
# tick: runs scheduled ahead come due there (the prefetch covers that interval), and runs
# whose event was missed. With the stream up those ticks look up the earliest run still
# scheduled in the queue instead, after each event (DeliveryWorker.next_step).
IDLE_POLL_FACTOR = {"default": 2, "chunks": 4}
TICK_JITTER = 1.3  # Prefect's polling loop spaces ticks up to 1.3x poll_seconds apart
KEEP_READY_SECONDS = 30.0
# What a tick does: poll the pool for due runs; poll, then look up the earliest run still
# scheduled in the queue; look it up (and poll at once if it is within the prefetch).
Step = Literal["poll", "poll, look", "look"]
# Prefect's server holds a run's Running state until its scheduled time, the wait rounded
# to whole seconds (WaitForScheduledTime): a run claimed within the prefetch and started
# at once was told to wait 1 or 2 s, and started up to half a second before or after its
# time. With less than half a second to go the server lets it run at once: a run
# scheduled ahead is started this long before its time, so that its request prepares
# (audience, rendering, connections) before the bell and its chunks send at it (never
# before: delivering.sleep_until).
START_AHEAD_SECONDS = 0.4


def new_worker_name() -> str:
    """``<host>-<pid>-<random>``: unique, and readable in the Work Pools page."""
    host = re.sub(r"[^a-z0-9-]", "-", socket.gethostname().lower())[:30]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class DeliveryResult(BaseWorkerResult):
    """A run the worker executed (its state is the run's own)."""


class DeliveryWorker(BaseWorker[BaseJobConfiguration, BaseVariables, DeliveryResult]):
    """Runs ``deliver-request`` flow runs of its pool in-process."""

    type = register.WORKER_TYPE
    job_configuration = BaseJobConfiguration
    _description = (
        "Executes campaign-trigger deliveries in the worker process itself "
        "(campaign-trigger worker): no process per run."
    )

    def __init__(
        self,
        *,
        concurrency: int,
        queue: str = "default",
        prefetch_seconds: float = 1.5,
        heartbeat_seconds: int = 10,
        name: str | None = None,
        idle_poll_factor: int = 1,
        wake_gap: float = 0.5,
    ) -> None:
        super().__init__(
            work_pool_name=catalog.DELIVERY_POOL,
            work_queues=[queue],
            name=name or f"{new_worker_name()}-{queue}",
            prefetch_seconds=prefetch_seconds,
            limit=concurrency,
            heartbeat_interval_seconds=heartbeat_seconds,
        )
        self.queue = queue
        self.concurrency = concurrency
        self.active: dict[UUID, asyncio.Task[Any]] = {}
        self._stopped: set[UUID] = set()  # runs stop_run cancelled, their tasks not ended
        self.claiming = True  # False once the process stops: see drain
        self.running: dict[UUID, tuple[FlowRun, str]] = {}  # each with its flow's name
        self._flows: dict[UUID, Flow[..., Any]] = {}
        self.idle_poll_factor = idle_poll_factor
        self.wake_gap, self._wake_poll_due, self._wake_polled = wake_gap, False, 0.0
        self._ticks, self._polled, self._woken = 0, 0.0, False
        # Set by wakeup.wake_on_events while its subscription is up: a run scheduled in
        # the queue wakes it, and ticks do not poll at the idle pace.
        self.events_up = False
        # The earliest run still scheduled in the queue (None: none), as last looked up;
        # unknown again after each event (a run scheduled maybe ahead) and each due poll.
        # An event is looked after twice, the second time at the idle tick after the
        # first: it can reach the worker before the server answers with its run.
        self._due: datetime | None = None
        self._due_known, self._wakes, self._looks_owed = False, 0, 0
        self._polled_window = datetime.min.replace(tzinfo=UTC)  # what the last poll asked for
        self._poll_lock, self._claims_settled, self._claiming = asyncio.Lock(), asyncio.Event(), 0
        self._claims_settled.set()
        self._context = contextvars.copy_context()  # the worker's own: see _start_soon

    async def __aenter__(self) -> Self:
        self._context = contextvars.copy_context()  # as started: Prefect's settings, client
        return await super().__aenter__()

    def _start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start ``func(*args)`` in the runs' task group in the worker's own context, never
        in its caller's. A share hands on from inside its chunk's task run (the request's
        own shares: inside the request's run's): the next share's poll, claim and run,
        started there, inherited that run's Prefect context (Prefect's engine took the
        share for a subflow run in process of it), and so did every run started after
        them from their predecessors' tasks. In CI (3 Dec) a share claimed as that
        request's run was being stopped ended with an ``AttributeError`` from Prefect's
        engine before it started, claimed and not executed: the request's cancel then
        set it Cancelling, and nobody ended it."""
        group = self._runs_task_group
        assert group is not None

        def start() -> None:
            group.start_soon(func, *args)

        # a copy: a task started here that starts another at once never re-enters it
        self._context.copy().run(start)

    @classmethod
    def get_default_base_job_template(cls) -> dict[str, Any]:
        """None: a run executes in this process, so job variables (the command, the
        environment, labels and a name per run of Prefect's default template) would mean
        nothing. The server validates each run it creates against the pool's variables:
        with Prefect's default template that cost it ~11 ms of CPU per one-message
        request, with none nothing (docs/benchmarks.md)."""
        return {}

    def wake(self) -> None:
        """A run was scheduled in this worker's queue (:mod:`wakeup`): poll at once if a
        slot is free (else when a run ends, or at the next tick with a free slot).
        Polling at once saves a send-now request the wait for the next tick (up to
        ``poll_seconds`` times Prefect's jitter). Wakes poll at most every ``wake_gap``:
        a busy worker, woken by every request, polls no more often than its ticks would."""
        self._woken, self._due_known, self._looks_owed = True, False, 2
        self._wakes += 1
        if self._runs_task_group is not None and not self._wake_poll_due:
            self._wake_poll_due = True
            self._start_soon(self._poll_when_woken)

    async def _poll_when_woken(self) -> None:
        try:
            await asyncio.sleep(self._wake_polled + self.wake_gap - time.monotonic())
            # Not if a tick polled meanwhile, nor with every slot taken (a run's end wakes
            # again): a wake that did not poll must not hold the next one back.
            if self._woken and self._slot_free():
                self._wake_polled = time.monotonic()
                await self._poll_now(woken=True)
        finally:
            self._wake_poll_due = False

    def next_step(self) -> Step | None:
        """What this tick of Prefect's polling loop does (:data:`Step`), or nothing.

        Nothing while every slot is taken (nothing could be taken; a run's end polls if
        a run was scheduled meanwhile). Else ``"poll"`` if a run was scheduled in the
        queue since the last poll (:meth:`wake`); ``"poll, look"`` if the earliest run
        scheduled ahead comes within the prefetch. At every ``idle_poll_factor``-th tick
        whose last poll (a wake's, a share's hand-on) is at least ``wake_gap`` old:
        without an event stream ``"poll"`` (runs coming due, events missed); with it,
        ``"look"`` if an event (twice) or a due poll left the earliest run unknown, ``"poll,
        look"`` if the earliest is left due (a paused pool, a concurrency limit: nothing
        says when the server would hand it out), else nothing: between events an idle
        worker asks the server nothing. And ``"poll"`` at least every
        ``KEEP_READY_SECONDS`` (Prefect shows a queue not polled for 60 s as not ready).
        A poll costs the Prefect server ~23 ms of CPU (docs/benchmarks.md)."""
        self._ticks += 1
        since = time.monotonic() - self._polled
        if since >= KEEP_READY_SECONDS:
            return "poll"
        if not self._slot_free():
            return None
        if self._woken:
            return "poll"
        if self._comes_due():
            return "poll, look"
        if since < self.wake_gap or self._ticks % self.idle_poll_factor:
            return None
        if not self.events_up:
            return "poll"
        if not self._due_known or self._looks_owed:
            return "look"
        return "poll, look" if self._left_due() else None

    def _comes_due(self) -> bool:
        """Whether the earliest run, known from a look and scheduled after the last poll's
        window, is now within the prefetch (the next poll's window)."""
        return self.events_up and not self._left_due() and self._due_now()

    def _due_now(self) -> bool:
        """Whether the earliest run, known from a look, is within the next poll's window."""
        return self._due_known and self._due is not None and self._due <= self._window()

    def _left_due(self) -> bool:
        """Whether the earliest run, known from a look, was within the last poll's window
        and is still scheduled: not handed out (or claimed by another worker since)."""
        return self._due_known and self._due is not None and self._due <= self._polled_window

    def _window(self) -> datetime:
        """The runs a poll now asks for are scheduled before this (Prefect's own bound)."""
        return datetime.now(UTC) + timedelta(seconds=int(self._prefetch_seconds))

    async def _look_ahead(self) -> None:
        """Look up the earliest run still scheduled in this queue (one read of the
        server); a wake meanwhile leaves it unknown (the run it announced may be
        earlier), and so does a failed read: the next idle tick looks again."""
        wakes = self._wakes
        try:
            runs = await self.client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                    )
                ),
                work_pool_filter=WorkPoolFilter(
                    name=WorkPoolFilterName(any_=[catalog.DELIVERY_POOL])
                ),
                work_queue_filter=WorkQueueFilter(name=WorkQueueFilterName(any_=[self.queue])),
                sort=FlowRunSort.NEXT_SCHEDULED_START_TIME_ASC,
                limit=1,
            )
        except Exception as exc:
            logger.warning("look-up of the %s queue's scheduled runs failed: %r", self.queue, exc)
            return
        if wakes == self._wakes:
            self._due = runs[0].next_scheduled_start_time if runs else None
            self._due_known, self._looks_owed = True, max(0, self._looks_owed - 1)

    def _slot_free(self) -> bool:
        return self._limiter is None or self._limiter.available_tokens >= 1

    async def get_and_submit_flow_runs(self) -> list[FlowRun]:
        """A tick of Prefect's polling loop: :meth:`next_step`'s. A look that finds the
        earliest run within the prefetch polls at once (one scheduled ahead, or one whose
        event came before the server answered with it), then looks for the next."""
        step = self.next_step()
        if step == "look":
            await self._look_ahead()
            step = "poll, look" if self._due_now() else None
        if step is None:
            return []
        runs = await self._poll()
        if step == "poll, look":
            self._due_known = False
            await self._claims_settled.wait()  # else it finds the runs just handed out
            await self._look_ahead()
        return runs

    async def _poll(self, *, woken: bool = False) -> list[FlowRun]:
        """Poll the pool and start claiming what it hands out. One poll at a time, and
        not before the runs the last one handed out are claimed: the server counts a run
        against a pool or queue concurrency limit once it is Pending, so a poll while a
        claim is still on its way would be handed a run the limit has no room for.
        ``woken``: a wake's poll, not made if a poll since the wake went first."""
        async with self._poll_lock:
            await self._claims_settled.wait()
            if (woken and not self._woken) or not self.claiming:
                return []
            self._polled, self._woken = time.monotonic(), False  # a wake from now: again
            self._polled_window = self._window()
            submitting = set(self._submitting_flow_run_ids)
            runs = await super().get_and_submit_flow_runs()
            # Each a _submit_run: the runs handed out and new in the set. A take-over
            # meanwhile adds its run too, but claims it itself: counted, it was never
            # counted down, and every later poll waited for it for good.
            claims = len({run.id for run in runs} - submitting)
            if claims:
                self._claiming += claims
                self._claims_settled.clear()
            return runs

    async def _poll_now(self, *, woken: bool = False) -> None:
        """Poll now, off the ticks, if a slot is free (``woken``: see :meth:`_poll`)."""
        if not self._slot_free():
            return
        try:
            await self._poll(woken=woken)
        except Exception as exc:  # the polling loop tries again on its own
            logger.warning("poll of the %s queue failed: %r", self.queue, exc)

    @property
    def claim_message(self) -> str:
        return f"{prefect_runs.WORKER_CLAIM_PREFIX}{self.name}"

    # -- submission ----------------------------------------------------------------

    async def _submit_run(self, flow_run: FlowRun) -> None:  # type: ignore[override]
        """A due run Prefect handed out (its slot taken): claim it and execute it."""
        try:
            await self._claim_and_start(flow_run)
        finally:
            self._claiming -= 1
            if not self._claiming:
                self._claims_settled.set()

    async def take_over(self, flow_run: FlowRun) -> bool:
        """Claim a run Prefect marked dead (Crashed) and execute it, if a slot is free.

        The claim is the same race-free transition as for a due run: Crashed -> Pending
        is accepted once; the second worker's Pending -> Pending is refused.
        """
        if self._limiter is None or not self.claiming:
            return False
        try:
            self._limiter.acquire_on_behalf_of_nowait(flow_run.id)
        except anyio.WouldBlock:
            return False
        self._submitting_flow_run_ids.add(flow_run.id)
        return await self._claim_and_start(flow_run)

    async def _claim_and_start(self, flow_run: FlowRun) -> bool:
        """Claim ``flow_run`` (its slot taken) and execute it; its slot is given back
        unless it started, whatever went wrong."""
        started = False
        try:
            started = await self._claim_and_start_holding_slot(flow_run)
        finally:
            if not started:
                self._release_limit_slot(flow_run.id)
                self._forget_submission(flow_run.id)
        return started

    async def _claim_and_start_holding_slot(self, flow_run: FlowRun) -> bool:
        sent_at = freeze.CLOCK()
        try:
            claimed = await prefect_runs.claim(self.client, flow_run.id, message=self.claim_message)
        except Exception as exc:
            logger.warning("could not claim run %s: %r", flow_run.id, exc)
            return False
        if not claimed:
            logger.debug("run %s claimed by someone else", flow_run.id)
            return False
        freeze.renew(sent_at)  # its Pending state: a sign of life as good as a heartbeat
        if self.queue == "default":  # a request's own run, not a share of its chunks
            try:
                await upkeep.own_run(flow_run, owner=self.name)
            except Exception as exc:  # a note for operators: the claimed run goes on
                logger.warning("run %s: its worker not noted on the request: %r", flow_run.id, exc)
        self._start_soon(self._execute, flow_run)
        return True

    def executes(self, flow_run_id: UUID) -> bool:
        """Whether this worker executes the run (claiming it, or claimed and not ended)."""
        return flow_run_id in self._submitting_flow_run_ids

    def _forget_submission(self, flow_run_id: UUID) -> None:
        self._submitting_flow_run_ids.discard(flow_run_id)
        if self._cancelling_observer is not None:
            self._cancelling_observer.remove_in_flight_flow_run_id(flow_run_id)

    async def _execute(self, flow_run: FlowRun) -> None:
        try:
            await self.run(flow_run, self.job_configuration())
        except asyncio.CancelledError:
            if flow_run.id not in self._stopped:
                raise
            # Stopped by its cancel (stop_run): the run ends here and its task returns.
            # A task of anyio's group that ended cancelled would cancel the whole group:
            # every other run of this worker, and its polls and heartbeats.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        except Exception as exc:
            # The engine reports the run's state itself; an error before it began leaves
            # the run claimed: the dead-run watch hands it over, and a cancel meanwhile is
            # ended by the cancel watch (upkeep.stop_cancelled_runs). A bug: its traceback.
            logger.warning("run %s ended with %r", flow_run.id, exc, exc_info=True)
        finally:
            self._stopped.discard(flow_run.id)
            self._release_limit_slot(flow_run.id)
            self._forget_submission(flow_run.id)
        if self._woken:  # a run was scheduled while every slot was taken: this one's now
            self.wake()

    def hand_on(self, flow_run_id: UUID) -> None:
        """A share started its last chunk: its slot goes to the next share, claimed and
        started now while that chunk is sent (:class:`fan_out.ShareSlots`)."""
        self.free_place(flow_run_id)  # freed again at the run's end: a no-op
        if self._runs_task_group is not None:
            self._start_soon(self._poll_now)

    def hold_place(self, flow_run_id: UUID) -> None:
        """Take a slot for a share this worker did not claim (a request's own shares,
        :meth:`fan_out.ShareSlots.own_share`), if one is free: one share fewer is claimed."""
        if self._limiter is not None:
            with contextlib.suppress(anyio.WouldBlock, RuntimeError):  # RuntimeError: held
                self._limiter.acquire_on_behalf_of_nowait(flow_run_id)

    def free_place(self, flow_run_id: UUID) -> None:
        """Free ``flow_run_id``'s slot (nothing if it holds none)."""
        self._release_limit_slot(flow_run_id)

    async def _flow_of(self, flow_run: FlowRun) -> Flow[..., Any]:
        """The flow of the run's deployment, from the catalog (looked up once)."""
        deployment_id = flow_run.deployment_id
        assert deployment_id is not None
        flow = self._flows.get(deployment_id)
        if flow is None:
            deployment = await self.client.read_deployment(deployment_id)
            name = (await self.client.read_flow(deployment.flow_id)).name
            for entry in catalog.DEPLOYMENTS:
                if entry.work_pool == catalog.DELIVERY_POOL and entry.load_flow().name == name:
                    flow = self._flows[deployment_id] = entry.load_flow()
                    break
            else:
                raise LookupError(f"no flow of this worker for deployment {name}/{deployment.name}")
        return flow

    async def run(
        self,
        flow_run: FlowRun,
        configuration: BaseJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> DeliveryResult:
        """Execute the run in this process; its final state is the engine's."""
        current = asyncio.current_task()
        if current is not None:
            self.active[flow_run.id] = current
        if task_status is not None:
            task_status.started(os.getpid())
        metrics.RUNS_IN_FLIGHT.inc()
        try:
            with logs.about_request(flow_run.parameters.get("request_id")):
                flow = await self._flow_of(flow_run)
                self.running[flow_run.id] = (flow_run, flow.name)
                await until_start(flow_run)
                state = await run_flow_async(
                    flow, flow_run=flow_run, parameters=flow_run.parameters, return_type="state"
                )
                logger.info("run %s finished: %s", flow_run.id, getattr(state, "type", state))
                if getattr(state, "type", None) == StateType.CANCELLING:
                    await upkeep.finish_cancel(
                        self.client, flow_run, message="Cancelled while running"
                    )
        finally:
            metrics.RUNS_IN_FLIGHT.dec()
            self.active.pop(flow_run.id, None)
            self.running.pop(flow_run.id, None)
        return DeliveryResult(identifier=str(flow_run.id), status_code=0)

    async def kill_infrastructure(
        self, infrastructure_pid: str, configuration: BaseJobConfiguration, grace_seconds: int = 30
    ) -> None:
        """A pending run is cancelled by the server's state alone: nothing runs yet."""
        return None

    async def drain(self) -> None:
        """Claim nothing more, and return once every run claimed or executed here has
        ended. A run claimed as the process stopped used to be cancelled with the worker's
        task group once the runs executed at the stop had ended: it crashed mid-send, its
        request failed."""
        self.claiming = False
        while self._submitting_flow_run_ids:
            if active := list(self.active.values()):
                await asyncio.gather(*active, return_exceptions=True)
            else:  # a claim on its way, or a run claimed and not yet started
                await asyncio.sleep(0.1)

    def stop_run(self, flow_run_id: UUID) -> asyncio.Task[Any] | None:
        """Cancel the asyncio task executing ``flow_run_id`` (if this worker runs it); that
        run alone ends (:meth:`_execute`)."""
        task = self.active.get(flow_run_id)
        if task is not None:
            self._stopped.add(flow_run_id)
            task.cancel()
        return task


async def until_start(flow_run: FlowRun) -> None:
    """Sleep until ``START_AHEAD_SECONDS`` before the run's scheduled time, as it was when
    the run was handed out (Prefect sets it while a run is scheduled: none for a run taken
    over)."""
    when = flow_run.next_scheduled_start_time
    if when is not None:
        await sleep_until(when - timedelta(seconds=START_AHEAD_SECONDS))


def engine_settings(poll_seconds: float) -> dict[Setting, Any]:
    """Prefect's settings in a worker process: its polling loop's tick, and no heartbeats
    from Prefect's engine, whose default (180 s in Prefect 3.8) starts a thread for every
    run and sends a heartbeat as the run starts; the process sends its runs' heartbeats
    itself (:mod:`heartbeats`)."""
    return {PREFECT_WORKER_QUERY_SECONDS: poll_seconds, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}


async def run_worker(
    *,
    concurrency: int,
    chunk_concurrency: int = 2,
    stop: asyncio.Event | None = None,
    poll_seconds: float = 0.5,
    prefetch_seconds: float = 2.0,
    heartbeat_seconds: int = 10,
    reconcile: bool = True,
) -> bool:
    """Run a delivery worker process until ``stop`` is set (False), or until one of its
    queues' workers stops on its own (True: start the process again): a Prefect worker of
    the pool's ``default`` queue (requests, ``concurrency`` at a time), one of its
    ``chunks`` queue (the shares of large requests, ``chunk_concurrency`` chunks at a
    time: a request waiting for its shares never holds the slots they need; a share on its
    last chunk hands its slot to the next), and the upkeep loops."""
    stop = stop or asyncio.Event()
    share_prefect_ssl_contexts()
    registered = await upkeep.until_prefect_answers(register.ensure_deployments, stop)
    if registered is None:
        return False
    name = new_worker_name()
    # A request scheduled ahead is claimed as it comes within the prefetch, at the next
    # tick (its time looked up after its event) or, without an event stream, at an idle
    # poll: the prefetch covers their interval (whole seconds: Prefect rounds it down), so
    # never late; the server holds the claimed run's start until its time.
    idle = poll_seconds * IDLE_POLL_FACTOR["default"] * TICK_JITTER
    prefetch = max(prefetch_seconds, math.ceil(idle))
    workers = [
        DeliveryWorker(
            concurrency=limit,
            queue=queue,
            name=f"{name}-{queue}",
            prefetch_seconds=prefetch,
            heartbeat_seconds=heartbeat_seconds,
            idle_poll_factor=IDLE_POLL_FACTOR[queue],
            wake_gap=poll_seconds,
        )
        for queue, limit in (("default", concurrency), ("chunks", chunk_concurrency))
    ]
    # The runs' heartbeats, sent by the process (not by Prefect's engine: no answer tells
    # it whether one arrived), are how a dead worker is noticed; a process frozen, or
    # whose heartbeats went unanswered, long enough for its runs to be taken over exits
    # before it sends again (delivery/freeze.py, heartbeats.py). One Prefect client for
    # every run (the engine would open one per run: a connection and a CSRF-token call
    # each), one watch for runs suspended in the UI for every run (suspension.py).
    dead_after = get_settings().dead_run_after_seconds
    watch = freeze.FreezeWatch(
        freeze.worker_threshold_seconds(dead_after),
        busy=lambda: any(w.active for w in workers),
        lease=freeze.lease_seconds(dead_after),
        grace=freeze.fence_grace_seconds(dead_after),
    )
    beats = heartbeats.RunHeartbeats(
        lambda: [run for w in workers for run in list(w.running.values())],
        interval=freeze.run_heartbeat_seconds(dead_after),
    )
    async with AsyncClientContext.get_or_create(), suspension.one_suspension_watch():
        with (
            temporary_settings(engine_settings(poll_seconds)),
            watch.watching(),
            beats.beating(),
        ):
            # A queue is polled at once when a run is scheduled in it (Prefect's events,
            # wakeup.py; wakes poll at most every poll_seconds), and as the earliest run
            # scheduled ahead comes due (DeliveryWorker.next_step); without the event
            # stream every IDLE_POLL_FACTOR-th tick (a poll costs the server ~23 ms of
            # CPU); the chunks queue also at once when a share hands on; a run ending with
            # its queue woken (a run scheduled while every slot was taken) wakes it again.
            # The cancel watch and the dead-run sweep too, when a run is cancelled or
            # marked dead (upkeep.py). A start that created the dead-run automation has
            # the runs claimed watched once more when the server has surely loaded it.
            fan_out.share_slots = fan_out.ShareSlots(chunk_concurrency, workers[1])
            serving = [asyncio.create_task(w.start(printer=logger.info)) for w in workers]
            sweeps = upkeep.Sweeps()
            loops = asyncio.gather(
                upkeep.run_loops(
                    workers,
                    stop=stop,
                    reconcile=reconcile,
                    sweeps=sweeps,
                ),
                wakeup.wake_on_events(workers, sweeps, stop),
                upkeep.watch_again_once_loaded(registered, stop),
            )
            logger.info("worker %s ready: polling every %.1f s", name, poll_seconds)
            ended: asyncio.Task[Any] | None = None
            try:
                ended = await _until_stopped(stop, serving)
            finally:
                if busy := sum(len(w._submitting_flow_run_ids) for w in workers):
                    logger.info("waiting for %d runs to finish", busy)
                # Requests first: a request's run here may need its shares claimed. Not a
                # worker whose start ended: its runs ended with its task group.
                for worker, serves in zip(workers, serving, strict=True):
                    if not serves.done():
                        await worker.drain()
                for task in serving:
                    task.cancel()
                loops.cancel()
                await asyncio.gather(*serving, loops, return_exceptions=True)
                fan_out.share_slots = None
                with contextlib.suppress(Exception):
                    await close_providers()
    if ended is not None:
        exc = None if ended.cancelled() else ended.exception()
        logger.error("a queue's worker stopped (%r): the process exits to be started again", exc)
    return ended is not None


async def _until_stopped(
    stop: asyncio.Event, serving: list[asyncio.Task[Any]]
) -> asyncio.Task[Any] | None:
    """Wait for ``stop``, or for a queue's worker that ended on its own (returned): its
    polling and heartbeats were over. Prefect's loops end so after about twelve failures
    in a row (a Prefect server out for minutes): the process, alive, claimed nothing more
    and looked idle; it now exits (:func:`main`) for its supervisor to start it again."""
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([stopped, *serving], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    return None if stop.is_set() else next((t for t in serving if t.done()), None)


def settle_collector() -> None:
    """Load what the process holds for life (the flows it runs; what rendering imports at
    its first use: :func:`render.warm_up`), then :func:`heap.settle`: freeze it, and let
    the garbage collector run a pass every 50,000 allocations instead of 700.

    A chunk allocates a few objects per message, and every full pass of the collector
    walked the whole heap (Prefect, SQLAlchemy, pydantic: ~230,000 objects): ~20 µs of
    the ~70 µs of worker CPU per message (docs/benchmarks.md, "A million in a minute").
    Frozen objects are skipped by every pass; what a run allocates is still collected,
    and most of it (a message's objects live a few milliseconds) is gone before a pass
    looks at it: with passes every 10,000 allocations, they still cost the worker ~2.7 µs
    per message, ~0.6 µs every 50,000.
    """
    for deployment in catalog.DEPLOYMENTS:
        if deployment.work_pool == catalog.DELIVERY_POOL:
            deployment.load_flow()
    render.warm_up()
    heap.settle()


def main(*, concurrency: int = 4, **options: Any) -> None:
    """Run a worker until SIGINT/SIGTERM (in-flight runs finish first), or until one of
    its queues' workers stopped (exit code 75: start it again); its metrics on
    ``CT_WORKER_METRICS_PORT`` when set."""
    settings = get_settings()
    logs.configure(settings.log_format)
    port = settings.worker_metrics_port
    if port:
        try:
            metrics.serve(port=port)
        except OSError as exc:  # a port in use: say which setting, not a traceback
            raise SystemExit(f"error: CT_WORKER_METRICS_PORT={port}: {exc.strerror}") from None
        logger.info("metrics on http://0.0.0.0:%d/metrics", port)
    settle_collector()

    async def serve() -> bool:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await run_worker(concurrency=concurrency, stop=stop, **options)

    if asyncio.run(serve()):
        raise SystemExit(freeze.EXIT_CODE)
