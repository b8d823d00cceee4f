"""Fixtures for the delivery e2e tests: the real Prefect server of the session with our
deployment, the sandbox providers (a thread of this process, so tests can read what it
accepted), and delivery workers as real child processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.states import Cancelled

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.services import prefect_runs
from support import ManagedProcess, free_port


@dataclass
class Sandbox:
    url: str
    port: int
    state: SandboxState

    def delivered(self, tokens: list[str]) -> dict[str, int]:
        """How many messages each token got. Read in place, not copied: each read is
        atomic, and a copy of every token the session's sandbox has seen (over 200 k
        after the scale-out test's first request), made 20 times a second by that test's
        poll, took the interpreter from the sandbox's thread while it delivered."""
        per_token = self.state.per_token
        return {token: per_token.get(token, 0) for token in tokens}


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    port = free_port()
    os.environ["CT_SANDBOX_PORT"] = str(port)
    get_settings.cache_clear()
    with running_sandbox(port=port) as state:
        yield Sandbox(url=f"http://127.0.0.1:{port}", port=port, state=state)


@pytest.fixture(scope="session")
def deployed_server(prefect_server: ManagedProcess) -> ManagedProcess:
    from campaign_trigger.deployments.register import ensure_deployments

    asyncio.run(ensure_deployments())
    return prefect_server


WorkerFactory = Callable[..., ManagedProcess]


@pytest.fixture
def start_worker(
    deployed_server: ManagedProcess, sandbox: Sandbox, session_dir: Path
) -> Iterator[WorkerFactory]:
    """Start ``campaign-trigger worker`` processes (fast polls and worker heartbeats),
    with more command-line ``options`` and environment ``env`` if given."""
    workers: list[ManagedProcess] = []

    def start(*options: str, **env: str) -> ManagedProcess:
        argv = [
            sys.executable,
            "-m",
            "campaign_trigger.cli",
            "worker",
            "--concurrency",
            "4",
            "--poll-seconds",
            "0.3",
            "--heartbeat-seconds",
            "1",
            *options,
        ]
        worker = ManagedProcess(
            "worker",
            argv,
            log_dir=session_dir,
            env={
                "CT_SANDBOX_PORT": str(sandbox.port),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "INFO",
                **env,
            },
        )
        workers.append(worker)
        worker.wait_logged(" ready: polling", timeout=60)
        return worker

    yield start
    for worker in workers:
        worker.stop()
    asyncio.run(end_leftover_runs())


async def end_leftover_runs() -> None:
    """Cancel the delivery runs a test left unfinished (it failed, or killed a worker and
    stopped before a new one took over): the next test's worker would otherwise take them
    over, and one failure would show as two."""
    unfinished = [
        StateType.SCHEDULED,
        StateType.PENDING,
        StateType.RUNNING,
        StateType.CANCELLING,
        StateType.PAUSED,
    ]
    async with get_client() as client:
        # A page at a time (tests without a worker leave runs scheduled ahead: the session
        # gathers more than a page); a cancelled run leaves the filter.
        while runs := [
            *await prefect_runs.runs_in_states(client, states=unfinished),
            *await prefect_runs.runs_in_states(
                client, states=[StateType.CRASHED], names=[prefect_runs.DEAD_RUN_STATE_NAME]
            ),
        ]:
            for run in runs:
                print(f"cancelling run {run.name} ({run.state_name}), left by the test")
                await client.set_flow_run_state(
                    run.id, Cancelled(message="left by an e2e test"), force=True
                )
