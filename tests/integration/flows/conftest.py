"""Fixtures for the delivery flow tests: a real Prefect server with our deployment,
the sandbox providers in a thread, and an in-process worker per test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from support import ManagedProcess, free_port


@pytest.fixture(scope="session")
def sandbox_url() -> Iterator[str]:
    port = free_port()
    os.environ["CT_SANDBOX_PORT"] = str(port)
    get_settings.cache_clear()
    with running_sandbox(port=port):
        yield f"http://127.0.0.1:{port}"
    os.environ.pop("CT_SANDBOX_PORT", None)
    get_settings.cache_clear()


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
    task = asyncio.create_task(
        run_worker(concurrency=4, stop=stop, poll_seconds=0.3, stale_after_seconds=6)
    )
    yield
    stop.set()
    await asyncio.wait_for(task, timeout=60)
