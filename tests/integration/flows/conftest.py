"""Fixtures for the delivery flow tests: a real Prefect server with our deployment,
the sandbox providers in a thread, and an in-process worker per test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from campaign_trigger.delivery.sandbox_rules import SandboxState
from support import ManagedProcess, free_port


@pytest.fixture(scope="session")
def sandbox_session() -> Iterator[tuple[str, SandboxState]]:
    port = free_port()
    with running_sandbox(port=port) as state:
        yield f"http://127.0.0.1:{port}", state


@pytest.fixture
def sandbox_env(
    sandbox_session: tuple[str, SandboxState], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The environment names this suite's sandbox for the test, not for the session:
    another suite's session sandbox (the e2e one) may share the process."""
    monkeypatch.setenv("CT_SANDBOX_PORT", sandbox_session[0].rsplit(":", 1)[1])
    # Apps given credentials of their own send with them to the sandbox, not to Google/Apple.
    monkeypatch.setenv("CT_SEND_TO_SANDBOX", "true")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def sandbox_url(sandbox_session: tuple[str, SandboxState], sandbox_env: None) -> str:
    return sandbox_session[0]


@pytest.fixture
def sandbox_state(sandbox_session: tuple[str, SandboxState], sandbox_env: None) -> SandboxState:
    """The sandbox's memory and settings (the latency of its answers)."""
    return sandbox_session[1]


@pytest.fixture(scope="session")
def deployed(prefect_server: ManagedProcess) -> ManagedProcess:
    from campaign_trigger.deployments.register import ensure_deployments

    asyncio.run(ensure_deployments())
    return prefect_server


@pytest.fixture
async def worker(deployed: ManagedProcess, sandbox_url: str) -> AsyncIterator[None]:
    """An in-process worker (with its outbox reconciler) for the test's duration."""
    from campaign_trigger.deployments.worker import run_worker

    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(concurrency=4, stop=stop, poll_seconds=0.3))
    yield
    stop.set()
    await asyncio.wait_for(task, timeout=60)
