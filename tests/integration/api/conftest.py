"""Fixtures for the API tests: tenants, an in-process client (ASGI) and the real server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from api_tenants import Server, Tenant, make_tenant, start_api_server

from campaign_trigger.api.app import create_app


@pytest.fixture
def tenant() -> Tenant:
    return make_tenant()


@pytest.fixture
def other_tenant() -> Tenant:
    return make_tenant()


@pytest.fixture
def tenant_factory() -> Callable[..., Tenant]:
    factory: Callable[..., Tenant] = make_tenant  # pytest's sibling import: untyped to mypy
    return factory


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The API in process (no lifespan: no outbox reconciler)."""
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


@pytest.fixture(scope="session")
def api_server(session_dir: Path) -> Iterator[Server]:
    """The real API server (uvicorn), sharing the session's database; never in sandbox
    mode, whichever suite set CT_SEND_TO_SANDBOX for its own sandbox first."""
    server = start_api_server(session_dir, CT_SEND_TO_SANDBOX="false")
    try:
        yield server
    finally:
        server.process.stop()
