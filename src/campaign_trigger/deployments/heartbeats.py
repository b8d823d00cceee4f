"""The heartbeats of a worker process's runs, and its lease (``delivery/freeze.py``).

Prefect marks a delivery run dead when no heartbeat (nor a state change) of it reached
the server for ``CT_DEAD_RUN_AFTER_SECONDS`` (the automation of ``register.py``), and
another worker takes it over. Prefect's engine sends such heartbeats itself, through its
events WebSocket, which never tells whether one arrived: a worker cut off from the server
would go on sending messages after its runs were handed to another worker.

So the worker sends them instead: a thread posts one ``prefect.flow-run.heartbeat``
event per run it executes (the same event as the engine's, with the same related
resources) to the server's ``POST /api/events`` every
``freeze.run_heartbeat_seconds``, all its runs in one call, and each call the server
answers renews the process's lease from the moment it was sent. Once the server stops
answering, the lease lapses before any of the runs can be marked dead, and the process
exits before it sends again. A thread, not a task of the event loop: a loop busy for
seconds does not lose the lease.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import prefect
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events import Event, RelatedResource
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from campaign_trigger.delivery import freeze

logger = logging.getLogger(__name__)

HEARTBEAT: Final = "prefect.flow-run.heartbeat"

RunsHeld = Callable[[], Iterable[tuple[FlowRun, str]]]
"""The runs a process executes now, each with its flow's name."""


def heartbeat(run: FlowRun, flow_name: str) -> Event:
    """The event Prefect's flow engine sends as a run's heartbeat."""
    return run_event(HEARTBEAT, run, flow_name)


def run_event(name: str, run: FlowRun, flow_name: str | None = None) -> Event:
    """An event ``name`` of ``run``, with the related resources Prefect's engine gives its
    heartbeat (its flow, named if ``flow_name`` is given; its deployment; its tags)."""
    flow = {"prefect.resource.id": f"prefect.flow.{run.flow_id}", "prefect.resource.role": "flow"}
    if flow_name is not None:
        flow["prefect.resource.name"] = flow_name
    related = [RelatedResource.model_validate(flow)]
    if run.deployment_id:
        related.append(
            RelatedResource.model_validate(
                {
                    "prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                    "prefect.resource.role": "deployment",
                }
            )
        )
    related += [
        RelatedResource.model_validate(
            {"prefect.resource.id": f"prefect.tag.{tag}", "prefect.resource.role": "tag"}
        )
        for tag in sorted(set(run.tags))
    ]
    return Event(
        event=name,
        resource={
            "prefect.resource.id": f"prefect.flow-run.{run.id}",
            "prefect.resource.name": run.name,
            "prefect.version": prefect.__version__,
        },
        related=related,
    )


class RunHeartbeats:
    """Every ``interval`` seconds, the heartbeats of the ``runs()`` held, posted in one
    call; each call answered renews the lease (:func:`freeze.renew`)."""

    def __init__(self, runs: RunsHeld, *, interval: float) -> None:
        self._runs = runs
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-heartbeats", daemon=True)
        self._failing = False

    @contextlib.contextmanager
    def beating(self) -> Iterator[RunHeartbeats]:
        """The thread runs while the block does."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def _beat(self) -> None:
        # No retries: a call that fails is not made again, the next one is sent in time.
        with (
            temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}),
            get_client(sync_client=True) as client,
        ):
            while not self._stop.wait(self.interval):
                sent_at = freeze.CLOCK()  # before the events' times: the lease ends first
                try:
                    events = [heartbeat(run, name) for run, name in self._runs()]
                    if not events:
                        continue
                    client.request(
                        "POST",
                        "/events",
                        json=[event.model_dump(mode="json") for event in events],
                        timeout=self.interval,
                    )
                except Exception as exc:
                    if not self._failing:
                        logger.warning("the runs' heartbeats did not reach Prefect: %r", exc)
                    self._failing = True
                    continue
                if self._failing:
                    logger.info("the runs' heartbeats reach Prefect again")
                self._failing = False
                freeze.renew(sent_at)
