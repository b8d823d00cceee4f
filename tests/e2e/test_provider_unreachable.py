"""A push provider nobody can reach (a sandbox that was never started, a wrong URL) is
visible to the operator: the report says ``FPErrPushFailed`` as before, and now the
worker's log names the provider's URL and the error for the app and chunk, and the API's
``/health`` shows the provider unreachable and the stack degraded."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from integration.client.running_stack import (
    RunningStack,
    running_stack,
    seed_tenant,
    sign_in,
)
from support import ManagedProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def stack(
    deployed_server: ManagedProcess, session_dir: Path, nowhere: str
) -> Iterator[RunningStack]:
    providers = {
        "CT_FCM_BASE_URL": nowhere,
        "CT_FCM_TOKEN_URI": f"{nowhere}/token",
        "CT_APNS_BASE_URL": nowhere,
        "CT_DELIVERY_MAX_ATTEMPTS": "2",
    }
    with running_stack(session_dir, extra_env=providers) as s:
        yield s


def test_an_unreachable_provider_is_logged_and_shown_by_health(
    stack: RunningStack, nowhere: str
) -> None:
    tenant = seed_tenant(users=2)
    auth = sign_in(stack.api_url, tenant)
    created = httpx.post(
        f"{stack.api_url}/api/campaigns/trigger",
        headers=auth,
        json={
            "campaign_id": tenant.campaign_id,
            "messages": [
                {"user_id": user, "template_variables": {"first_name": "A", "order_id": "1"}}
                for user in tenant.users
            ],
        },
    )
    assert created.status_code == 200, created.text
    request_id = created.json()["request_id"]
    deadline = time.monotonic() + 120
    while (
        report := httpx.get(
            f"{stack.api_url}/api/campaigns/report", params={"request_id": request_id}, headers=auth
        )
    ).status_code != 200:
        assert time.monotonic() < deadline, (report.text, stack.logs())
        time.sleep(1)
    [link] = report.json()["reports"]
    rows = httpx.get(link).text.splitlines()[1:]
    assert [row.rsplit(",", 1)[1] for row in rows] == ["FPErrPushFailed"] * 2

    [worker] = [p for p in stack.processes if p.name == "worker"]
    lines = [line for line in worker.log_tail(400).splitlines() if "pushes failed" in line]
    assert len(lines) == 1, worker.log_tail(80)
    assert f"request {request_id} chunk 0 app {tenant.app_id}: 2 of 2 pushes failed" in lines[0]
    assert f"at FCM {nowhere}: token endpoint {nowhere}/token unreachable: ConnectError" in lines[0]

    health = httpx.get(f"{stack.api_url}/health").json()
    assert health["status"] == "degraded"
    assert health["database"] == "ok"
    for name in ("fcm", "apns"):
        assert health["providers"][name] == {"status": "unreachable"}, health
    assert nowhere not in json.dumps(health)  # where and why: the API's log, not its answer
