"""The embedded stack's Prefect server on SQLite takes concurrent writers without
"database is locked": flow runs created and driven through their states by several
clients at once all land, and the server never answers a lock error. Its services: the
event persister off, the task-run recorder writing in batches once a second."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import State, StateType
from prefect.states import Completed, Pending, Running, Scheduled

from campaign_trigger import heap
from campaign_trigger.deployments import prefect_server as embedded
from support import (
    ManagedProcess,
    free_port,
    prefect_server_argv,
    prefect_server_env,
    probe_output,
    wait_http,
)

pytestmark = [pytest.mark.slow]

CLIENTS = 6
RUNS_PER_CLIENT = 25


@flow(name="embedded-server-load")
def _load() -> None:
    """Only its name matters: the runs are driven by hand."""


async def _drive(api: str) -> list[uuid.UUID]:
    """Create runs and move each Scheduled -> Pending -> Running -> Completed."""
    async with PrefectClient(api=api) as client:
        ids: list[uuid.UUID] = []
        for _ in range(RUNS_PER_CLIENT):
            run = await client.create_flow_run(_load, name=uuid.uuid4().hex[:8], state=Scheduled())
            states: tuple[State[Any], ...] = (Pending(), Running(), Completed())
            for state in states:
                result = await client.set_flow_run_state(run.id, state)
                assert result.status.value == "ACCEPT", result
            ids.append(run.id)
        return ids


async def _create_in_bulk(api: str, deployment_id: uuid.UUID, keys: list[str]) -> None:
    """Create runs with the bulk route, as the outbox drainers do (several processes may
    race on the same idempotency keys): no item may fail. On a stock SQLite server this
    is where "database is locked" comes back, item by item."""
    async with PrefectClient(api=api) as client:
        for start in range(0, len(keys), 10):
            body = [
                {"name": key, "idempotency_key": key, "state": {"type": "SCHEDULED"}}
                for key in keys[start : start + 10]
            ]
            answer = await client.request(
                "POST",
                "/deployments/{id}/create_flow_run/bulk",  # type: ignore[arg-type]
                path_params={"id": deployment_id},
                json=body,
            )
            results = answer.json()["results"]
            assert [r.get("error") for r in results] == [None] * len(body), results


async def test_concurrent_writers_all_land_without_a_lock_error(tmp_path: Path) -> None:
    port = free_port()
    env = prefect_server_env(tmp_path, port)
    server = ManagedProcess("prefect-sqlite", prefect_server_argv(port), env=env, log_dir=tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/health", timeout=90, process=server)
        api = env["PREFECT_API_URL"]
        async with PrefectClient(api=api) as client:
            flow_id = await client.create_flow(_load)
            deployment_id = await client.create_deployment(flow_id=flow_id, name="load")
        keys = [uuid.uuid4().hex for _ in range(100)]
        runs, _, _ = await asyncio.gather(
            asyncio.gather(*(_drive(api) for _ in range(CLIENTS))),
            _create_in_bulk(api, deployment_id, keys),
            _create_in_bulk(api, deployment_id, keys),
        )
        async with PrefectClient(api=api) as client:
            for run_id in (run_id for ids in runs for run_id in ids):
                run = await client.read_flow_run(run_id)
                assert run.state is not None
                assert run.state.type == StateType.COMPLETED
    finally:
        server.stop()
    assert "database is locked" not in server.log_path.read_text()


async def test_the_server_runs_without_the_event_persister_and_records_task_runs_in_batches(
    prefect_server: ManagedProcess,
) -> None:
    async with get_client() as client:
        settings = (await client.request("GET", "/admin/settings")).json()  # type: ignore[arg-type]
    services = settings["server"]["services"]
    assert services["event_persister"]["enabled"] is False
    recorder = services["task_run_recorder"]
    assert recorder["enabled"] is True
    assert recorder["batch_size"] == embedded.RECORDER_BATCH > 1
    assert recorder["flush_interval"] == embedded.RECORDER_FLUSH_SECONDS == 1


BUILT_AS_STARTED = """
import gc, prefect.cli
from prefect.server.api import server

def start():  # what `prefect server start` does before it serves
    loading = gc.get_threshold()[0]
    server.create_app(final=True, webserver_only=False)
    print(loading, gc.get_freeze_count(), gc.get_threshold()[0])

prefect.cli.app = start
from campaign_trigger.deployments import prefect_server
prefect_server.main()
"""


def test_the_server_s_heap_is_frozen_once_its_application_is_built(tmp_path: Path) -> None:
    """Its ~290,000 objects at that point are out of the collector's passes (a full pass
    over the server's heap took 0.4 s of its event loop, every few tens of seconds under
    load), and the young passes come every 50,000 allocations instead of 700, from before
    Prefect's server is imported (its start ~0.3 s of CPU shorter)."""
    printed = probe_output(BUILT_AS_STARTED, **prefect_server_env(tmp_path, free_port()))
    loading, frozen, young_every = map(int, printed.split())
    assert loading == young_every == heap.YOUNG_PASS_EVERY
    assert frozen > 100_000
