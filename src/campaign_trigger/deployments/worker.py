"""``campaign-trigger worker``: claims due ``deliver-request`` runs and runs them in-process.

Why not ``prefect worker``/``serve``: they start a ~90 MiB process per run (~2 s),
too slow for the 1 s punctuality target and for many small requests. This worker:

* polls the Prefect API every ``poll_seconds`` for Scheduled runs due within
  ``prefetch_seconds``, and claims each one Scheduled -> Pending with a message
  naming this worker. The server refuses the claim if anyone (another worker, a
  cancel) claimed it first, so N workers on N machines never run a run twice;
* executes claimed runs with ``prefect.flow_engine.run_flow_async``, up to
  ``concurrency`` at a time, on one event loop (the flow sleeps until ``send_at``;
  the server also holds Running until the scheduled time);
* writes a heartbeat every ``heartbeat_seconds`` (a Prefect variable
  ``ct-worker-<id>``, visible in the UI under Variables);
* recovers runs of dead workers: a Pending/Running run whose claiming worker's
  heartbeat is older than ``stale_after_seconds`` is set back to Scheduled (forced)
  and re-claimed by whichever worker polls first. The flow skips the chunks already
  recorded, so no device gets a message twice and none is skipped. A run left
  Pending by a cancel that died half-way is cancelled;
* runs the outbox reconciler (``services.scheduling.run_reconciler``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import ssl
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import VariableCreate, VariableUpdate
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.flow_engine import run_flow_async
from prefect.states import Scheduled

from campaign_trigger.deployments.register import ensure_deployments
from campaign_trigger.flows.deliver import deliver_request
from campaign_trigger.services import delivering, prefect_runs, scheduling
from campaign_trigger.services.delivery_run import set_state
from campaign_trigger.store.models import RequestState

logger = logging.getLogger("campaign_trigger.deployments.worker")  # also under -m

HEARTBEAT_PREFIX = "ct-worker-"


def new_worker_id() -> str:
    host = re.sub(r"[^a-z0-9-]", "-", socket.gethostname().lower())[:30]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _worker_of(message: str | None) -> str | None:
    if message and message.startswith(prefect_runs.WORKER_CLAIM_PREFIX):
        return message.removeprefix(prefect_runs.WORKER_CLAIM_PREFIX).strip()
    return None


class Worker:
    """One worker process's loops: poll and claim, execute, heartbeat, recover, reconcile."""

    def __init__(
        self,
        *,
        concurrency: int,
        poll_seconds: float = 0.5,
        prefetch_seconds: float = 1.5,
        heartbeat_seconds: float = 5.0,
        stale_after_seconds: float = 30.0,
        reconcile: bool = True,
    ) -> None:
        self.id = new_worker_id()
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.prefetch_seconds = prefetch_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_after = timedelta(seconds=stale_after_seconds)
        self.reconcile = reconcile
        self.active: dict[UUID, asyncio.Task[None]] = {}
        self.slot_freed = asyncio.Event()

    @property
    def claim_message(self) -> str:
        return f"{prefect_runs.WORKER_CLAIM_PREFIX}{self.id}"

    async def run(self, stop: asyncio.Event) -> None:
        share_prefect_ssl_contexts()
        await self._ensure_deployments(stop)
        logger.info("worker %s ready: polling every %.1f s", self.id, self.poll_seconds)
        loops = [self._poll_loop(stop), self._heartbeat_loop(stop), self._recovery_loop(stop)]
        if self.reconcile:
            loops.append(scheduling.run_reconciler(stop=stop, interval=self.poll_seconds))
        try:
            await asyncio.gather(*loops)
        finally:
            if self.active:
                logger.info("waiting for %d runs to finish", len(self.active))
                await asyncio.gather(*self.active.values(), return_exceptions=True)
            with contextlib.suppress(Exception):
                await delivering.close_providers()
            with contextlib.suppress(Exception):
                async with get_client() as client:
                    await client.delete_variable_by_name(HEARTBEAT_PREFIX + self.id)

    async def _ensure_deployments(self, stop: asyncio.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                await ensure_deployments()
                return
            except Exception as exc:  # Prefect not up yet
                logger.warning("cannot register deployments yet: %r", exc)
                await _sleep(stop, delay)
                delay = min(delay * 2, 10.0)

    # -- poll, claim, execute ------------------------------------------------------

    async def _poll_loop(self, stop: asyncio.Event) -> None:
        async with get_client() as client:
            while not stop.is_set():
                try:
                    await self._poll_once(client)
                except Exception as exc:
                    logger.warning("poll failed: %r", exc)
                    prefect_runs.forget_deployment_id()
                self.slot_freed.clear()
                await _sleep(stop, self.poll_seconds, self.slot_freed)

    async def _poll_once(self, client: PrefectClient) -> None:
        free = self.concurrency - len(self.active)
        if free <= 0:
            return
        due = datetime.now(UTC) + timedelta(seconds=self.prefetch_seconds)
        for run in await prefect_runs.due_runs(client, before=due, limit=free):
            if run.id in self.active:
                continue
            if await prefect_runs.claim(client, run.id, message=self.claim_message):
                self.active[run.id] = asyncio.create_task(self._execute(run))
            else:
                logger.debug("run %s claimed by someone else", run.id)

    async def _execute(self, run: FlowRun) -> None:
        flow_run_id = run.id
        try:
            state = await run_flow_async(
                deliver_request, flow_run=run, parameters=run.parameters, return_type="state"
            )
            logger.info("run %s finished: %s", flow_run_id, getattr(state, "type", state))
            if isinstance(state, State) and state.type == StateType.CANCELLING:
                async with get_client() as client:  # the engine stopped on the UI's cancel
                    await self._finish_cancel(client, run, message="Cancelled while running")
        except BaseException as exc:  # the engine reports the run's state itself
            logger.warning("run %s ended with %r", flow_run_id, exc)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            self.active.pop(flow_run_id, None)
            self.slot_freed.set()

    # -- heartbeat -----------------------------------------------------------------

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        name = HEARTBEAT_PREFIX + self.id
        created = False
        async with get_client() as client:
            while not stop.is_set():
                value = {"at": datetime.now(UTC).isoformat(), "active": len(self.active)}
                try:
                    if created:
                        await client.update_variable(VariableUpdate(name=name, value=value))
                    else:
                        await client.create_variable(
                            VariableCreate(name=name, value=value, tags=["campaign-trigger-worker"])
                        )
                        created = True
                except Exception as exc:
                    logger.warning("heartbeat failed: %r", exc)
                    created = False if "404" in repr(exc) else created
                with contextlib.suppress(Exception):
                    await self._honour_cancelling(client)
                await _sleep(stop, self.heartbeat_seconds)

    async def _honour_cancelling(self, client: PrefectClient) -> None:
        """A run of ours set Cancelling (the UI's Cancel on a started run): stop it.

        The chunk in flight is abandoned (its outcomes are not recorded); the run ends
        Cancelled and the request is mirrored as canceled.
        """
        if not self.active:
            return
        runs = await prefect_runs.runs_in_states(
            client, states=[StateType.CANCELLING], ids=list(self.active)
        )
        for run in runs:
            task = self.active.get(run.id)
            if task is None:
                continue
            logger.warning("run %s was cancelled while running: stopping it", run.id)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await self._finish_cancel(client, run, message="Cancelled while running")

    async def _worker_alive(self, client: PrefectClient, worker_id: str) -> bool:
        if worker_id == self.id:
            return True
        variable = await client.read_variable_by_name(HEARTBEAT_PREFIX + worker_id)
        if variable is None:
            return False
        updated = variable.updated or variable.created
        if updated is None:
            return True
        return datetime.now(UTC) - updated < self.stale_after

    # -- recovery ------------------------------------------------------------------

    async def _recovery_loop(self, stop: asyncio.Event) -> None:
        interval = max(self.stale_after.total_seconds() / 3, 1.0)
        await _sleep(stop, min(interval, 2.0))
        async with get_client() as client:
            while not stop.is_set():
                try:
                    await self.recover_once(client)
                except Exception as exc:
                    logger.warning("recovery sweep failed: %r", exc)
                await _sleep(stop, interval)

    async def _claimer(self, client: PrefectClient, run: FlowRun) -> str | None:
        """The message of the run's latest Pending state (who claimed it)."""
        if run.state is not None and run.state.type == StateType.PENDING:
            return run.state.message
        states = await client.read_flow_run_states(run.id)
        pending = [s for s in states if s.type == StateType.PENDING]
        return pending[-1].message if pending else None

    async def recover_once(self, client: PrefectClient) -> int:
        """Put runs of dead workers back to Scheduled; finish half-done cancels."""
        recovered = 0
        runs = await prefect_runs.runs_in_states(
            client, states=[StateType.PENDING, StateType.RUNNING]
        )
        now = datetime.now(UTC)
        for run in runs:
            if run.id in self.active or run.state is None:
                continue
            claimer = await self._claimer(client, run)
            age = now - run.state.timestamp
            if claimer == prefect_runs.CANCEL_CLAIM_MESSAGE:
                if run.state.type == StateType.PENDING and age > self.stale_after:
                    await self._finish_cancel(client, run)
                continue
            worker_id = _worker_of(claimer)
            if worker_id is None or await self._worker_alive(client, worker_id):
                continue
            fresh = await client.read_flow_run(run.id)  # re-check: nothing moved meanwhile
            if fresh.state is None or fresh.state.id != run.state.id:
                continue
            logger.warning("run %s of dead worker %s: rescheduled", run.id, worker_id)
            await client.set_flow_run_state(
                run.id,
                Scheduled(
                    scheduled_time=datetime.now(UTC),
                    message=f"Rescheduled: worker {worker_id} stopped heartbeating",
                ),
                force=True,
            )
            recovered += 1
        if recovered:
            self.slot_freed.set()
        return recovered

    async def _finish_cancel(
        self, client: PrefectClient, run: FlowRun, *, message: str = "Cancelled by campaign-trigger"
    ) -> None:
        await prefect_runs.cancel_claimed(client, run.id, message=message)
        request_id = str(run.parameters.get("request_id", ""))
        if request_id:
            await asyncio.to_thread(set_state, request_id, RequestState.canceled)


def share_prefect_ssl_contexts() -> None:
    """Make Prefect clients of this process share their SSL context.

    Every ``PrefectClient`` builds a fresh ``ssl.create_default_context(cafile=...)``,
    loading the CA bundle (~50 ms of CPU), even for a plain-HTTP API; the flow engine
    makes several clients per run, which profiling showed to be the worker's largest
    cost (a quarter of a core at 3 runs/s). Contexts are safe to share; this caches
    them per arguments, for the Prefect client module only.
    """
    import prefect.client.orchestration as orchestration

    namespace = vars(orchestration)
    if not isinstance(namespace.get("ssl"), _SharedSSL):
        namespace["ssl"] = _SharedSSL()


class _SharedSSL:
    """The ``ssl`` module, with ``create_default_context`` cached per arguments."""

    def __init__(self) -> None:
        self._contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}

    def create_default_context(self, *args: Any, **kwargs: Any) -> ssl.SSLContext:
        key = (args, tuple(sorted(kwargs.items())))
        context = self._contexts.get(key)
        if context is None:
            context = self._contexts[key] = ssl.create_default_context(*args, **kwargs)
        return context

    def __getattr__(self, name: str) -> Any:
        return getattr(ssl, name)


async def _sleep(stop: asyncio.Event, seconds: float, *events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in (stop, *events)]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def run_worker(
    *, concurrency: int, stop: asyncio.Event | None = None, **options: Any
) -> None:
    """Run a worker until ``stop`` is set (options: see :class:`Worker`)."""
    await Worker(concurrency=concurrency, **options).run(stop or asyncio.Event())


def main(*, concurrency: int = 4, **options: Any) -> None:
    """Run a worker until SIGINT/SIGTERM (in-flight runs finish first)."""
    package_logger = logging.getLogger("campaign_trigger")
    if not package_logger.handlers:  # Prefect's logging setup leaves the root at WARNING
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        package_logger.addHandler(handler)
        package_logger.setLevel(logging.INFO)
        package_logger.propagate = False

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(concurrency=concurrency, stop=stop, **options)

    asyncio.run(serve())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--poll-seconds", type=float, default=0.5)
    parser.add_argument("--prefetch-seconds", type=float, default=1.5)
    parser.add_argument("--heartbeat-seconds", type=float, default=5.0)
    parser.add_argument("--stale-after-seconds", type=float, default=30.0)
    args = parser.parse_args()
    main(
        concurrency=args.concurrency,
        poll_seconds=args.poll_seconds,
        prefetch_seconds=args.prefetch_seconds,
        heartbeat_seconds=args.heartbeat_seconds,
        stale_after_seconds=args.stale_after_seconds,
    )
