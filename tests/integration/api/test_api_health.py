"""``GET /health`` names each dependency: a provider nobody can reach (a sandbox that was
never started) makes the stack ``degraded`` (the URL and the reason in the API's log, not
in the unauthenticated answer), not a silent column of ``FPErrPushFailed`` in the
reports; a part the service needs (the database, the storage, Prefect) that is down makes
the real server answer 503 naming it (not why nor where), and a route that needs the
database down answers 503 with Retry-After, not 500."""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from api_tenants import Tenant, start_api_server

from campaign_trigger.api.app import create_app
from campaign_trigger.api.errors import DATABASE_DOWN
from campaign_trigger.config import get_settings
from campaign_trigger.delivery.sandbox import running_sandbox
from support import ManagedProcess, free_port


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


async def test_unreachable_providers_make_the_health_degraded_with_the_reason_logged(
    api: httpx.AsyncClient,
    sandbox_port: int,
    prefect_server: ManagedProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="campaign_trigger.services.health"):
        answer = await api.get("/health")
    assert answer.status_code == 200  # the API itself serves: the parts it needs answer
    body = answer.json()
    assert body["status"] == "degraded"
    assert body["database"] == "ok"
    assert body["providers"] == {
        "fcm": {"status": "unreachable"},
        "apns": {"status": "unreachable"},
    }
    sandbox = f"http://127.0.0.1:{sandbox_port}"
    assert str(sandbox_port) not in answer.text  # where it looked: in the log only
    for name in ("fcm", "apns"):
        [line] = [r.getMessage() for r in caplog.records if f"health: {name} " in r.getMessage()]
        assert f"health: {name} unreachable: {sandbox}" in line
        assert "refused" in line.lower(), line


async def test_reachable_providers_are_ok(api: httpx.AsyncClient, sandbox_port: int) -> None:
    with running_sandbox(port=sandbox_port):
        body = (await api.get("/health")).json()
    assert body["providers"] == {"fcm": {"status": "ok"}, "apns": {"status": "ok"}}


@pytest.fixture(scope="module")
def dead_url() -> str:
    return f"127.0.0.1:{free_port()}"


def assert_down(answer: httpx.Response, part: str, *, hidden: str) -> None:
    """A 503 naming ``part`` alone as down, without its reason: no error text, nor
    ``hidden`` (where the part was looked for)."""
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert hidden not in answer.text
    assert "errors" not in body
    assert body["status"] == "down"
    assert body["down"] == [part]
    assert body[part] == "unreachable"
    assert all(body[other] == "ok" for other in ("database", "storage", "prefect") if other != part)


def outbox_depth(url: str) -> float:
    page = httpx.get(f"{url}/metrics").text
    [line] = [
        line for line in page.splitlines() if line.startswith("campaign_trigger_outbox_depth")
    ]
    return float(line.split()[-1])


def test_prefect_down_makes_the_real_server_answer_503_and_requests_wait_in_the_outbox(
    prefect_server: ManagedProcess, session_dir: Path, dead_url: str, tenant: Tenant
) -> None:
    server = start_api_server(session_dir, PREFECT_API_URL=f"http://{dead_url}/api")
    try:
        assert_down(httpx.get(f"{server.url}/health", timeout=30), "prefect", hidden=dead_url)
        before = outbox_depth(server.url)
        created = httpx.post(
            f"{server.url}/api/campaigns/trigger",
            headers=tenant.auth(),
            json={"campaign_id": tenant.plain, "messages": [{"user_id": "u1"}]},
        )
        assert created.status_code == 200, created.text  # accepted: persisted, not scheduled
        assert outbox_depth(server.url) == before + 1
        request_id = created.json()["request_id"]
        cancel = f"{server.url}/api/campaigns/request/{request_id}/cancel"
        assert httpx.put(cancel, headers=tenant.auth()).status_code == 200
        assert outbox_depth(server.url) == before
    finally:
        server.process.stop()


@pytest.mark.parametrize(
    ("part", "setting", "value"),
    [
        ("database", "CT_DATABASE_URL", "postgresql://postgres@{dead}/nothing"),
        ("storage", "CT_STORAGE_URL", "{tmp}/storage"),  # removed once the server is up
    ],
)
def test_a_part_down_makes_the_real_server_answer_503_naming_it(
    prefect_server: ManagedProcess,
    session_dir: Path,
    tmp_path: Path,
    dead_url: str,
    part: str,
    setting: str,
    value: str,
) -> None:
    server = start_api_server(session_dir, **{setting: value.format(dead=dead_url, tmp=tmp_path)})
    try:
        if part == "storage":
            assert httpx.get(f"{server.url}/health").json()["storage"] == "ok"
            shutil.rmtree(tmp_path / "storage")
        hidden = dead_url if part == "database" else str(tmp_path)
        assert_down(httpx.get(f"{server.url}/health", timeout=30), part, hidden=hidden)
        if part == "database":  # every route that needs it answers 503, not 500
            login = {"user": {"email": "someone@example.com", "password": "a password"}}
            answer = httpx.post(f"{server.url}/users/sign_in", json=login, timeout=30)
            assert answer.status_code == 503, answer.text
            assert answer.json() == {"error_message": DATABASE_DOWN}
            assert answer.headers["Retry-After"] == "5"
    finally:
        server.process.stop()
