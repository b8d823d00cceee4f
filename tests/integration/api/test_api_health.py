"""``GET /health`` names each dependency: a provider nobody can reach (a sandbox that was
never started) makes the stack ``degraded`` with the URL and the reason, not a silent
column of ``FPErrPushFailed`` in the reports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from campaign_trigger.api.app import create_app
from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from support import free_port


@pytest.fixture
def sandbox_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port the settings name for the sandbox providers (nothing listens yet)."""
    port = free_port()
    monkeypatch.setenv("CT_SANDBOX_PORT", str(port))
    get_settings.cache_clear()
    yield port
    monkeypatch.undo()
    get_settings.cache_clear()


@pytest.fixture
async def api(sandbox_port: int) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def test_unreachable_providers_make_the_health_degraded_with_the_reason(
    api: httpx.AsyncClient, sandbox_port: int
) -> None:
    answer = await api.get("/health")
    assert answer.status_code == 200  # the API itself serves: its database answers
    body = answer.json()
    assert body["status"] == "degraded"
    assert body["database"] == "ok"
    sandbox = f"http://127.0.0.1:{sandbox_port}"
    for name in ("fcm", "apns"):
        provider = body["providers"][name]
        assert provider["status"] == "unreachable", body
        assert provider["url"] == sandbox
        assert "refused" in provider["error"].lower(), provider


async def test_reachable_providers_are_ok(api: httpx.AsyncClient, sandbox_port: int) -> None:
    with running_sandbox(port=sandbox_port):
        body = (await api.get("/health")).json()
    url = f"http://127.0.0.1:{sandbox_port}"
    assert body["providers"] == {
        "fcm": {"status": "ok", "url": url},
        "apns": {"status": "ok", "url": url},
    }
