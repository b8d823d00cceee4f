"""One watch for suspended runs per worker process, instead of one per run.

Prefect 3.8's flow engine watches every deployment run it executes for the UI's
*Suspend*: per run, ``prefect.flow_engine.observe_flow_run_suspension`` starts a thread
with its own event loop and client, subscribes to the server's event stream (a
websocket, and a query of the last minute's events), reads the run, and holds the
subscription while the run lasts, so the server matches every event against one
subscriber per run in flight. A worker that executes many runs in-process paid the
Prefect server ~35 ms of CPU per one-message request for it (bench/server_cost.py,
docs/benchmarks.md).

:func:`one_suspension_watch` opens Prefect's own ``FlowRunSuspendingObserver`` once, on
the worker's event loop, and points the engine's hook at it for the worker's life:
each run the worker executes is registered with it while it runs. A run suspended in
the UI still stops at its next step, as before. Runs executed on another event loop
(none in a worker) keep Prefect's per-run watch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

from prefect import flow_engine
from prefect._flow_run_suspension import FlowRunSuspensionRequest, observe_flow_run_suspension
from prefect._internal.observers import FlowRunSuspendingObserver
from prefect.client.schemas.objects import State

_HOOK = "observe_flow_run_suspension"  # the name the engine calls it by


@contextlib.asynccontextmanager
async def one_suspension_watch() -> AsyncIterator[None]:
    """Watch the runs this event loop executes for a suspension, with one subscription."""
    loop = asyncio.get_running_loop()
    requests: dict[UUID, FlowRunSuspensionRequest] = {}
    per_run = observe_flow_run_suspension

    def suspended(flow_run_id: UUID, state: State[Any]) -> None:
        request = requests.get(flow_run_id)
        if request is not None:
            request.mark_requested(state)  # the run raises Pause at its next step

    async with FlowRunSuspendingObserver(on_suspended=suspended) as observer:

        @contextlib.contextmanager
        def observe(
            flow_run_id: UUID, suspension_request: FlowRunSuspensionRequest, **options: Any
        ) -> Iterator[None]:
            try:
                here = asyncio.get_running_loop() is loop
            except RuntimeError:  # a sync engine in a thread of its own
                here = False
            if not here:
                with per_run(flow_run_id, suspension_request, **options):
                    yield
                return
            requests[flow_run_id] = suspension_request
            observer.add_in_flight_flow_run_id(flow_run_id)
            try:
                yield
            finally:
                observer.remove_in_flight_flow_run_id(flow_run_id)
                requests.pop(flow_run_id, None)

        setattr(flow_engine, _HOOK, observe)
        try:
            yield
        finally:
            setattr(flow_engine, _HOOK, per_run)
