"""A cancel made in the Prefect UI is the same cancel, as the HTTP API reports it."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prefect import get_client
from prefect.states import Cancelling

from campaign_trigger.services.admin import create_account
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Organisation
from delivery_support import load_request, seed_tenant, state_name, wait_for_state
from e2e.conftest import Sandbox
from support import ManagedProcess, free_port, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def api_url(deployed_server: ManagedProcess, sandbox: Sandbox, session_dir: Path) -> Iterator[str]:
    """The HTTP API (with its outbox reconciler) as a child process."""
    port = free_port()
    api = ManagedProcess(
        "api",
        [str(Path(sys.executable).with_name("campaign-trigger")), "api"],
        env={
            "CT_API_PORT": str(port),
            "CT_SANDBOX_PORT": str(sandbox.port),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        },
        log_dir=session_dir,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60, process=api)
        yield f"http://127.0.0.1:{port}"
    finally:
        api.stop()


async def test_a_run_cancelled_in_prefect_is_already_canceled_for_the_api(api_url: str) -> None:
    tenant = seed_tenant()
    email = f"member-{uuid.uuid4().hex[:6]}@example.com"
    with session_scope() as session:
        org = session.get(Organisation, tenant.org_id)
        assert org is not None
        create_account(session=session, org_name=org.name, email=email, password="s3cret-pass")
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        signed = await http.post(
            "/users/sign_in", json={"user": {"email": email, "password": "s3cret-pass"}}
        )
        http.headers["Authorization"] = signed.headers["Authorization"]
        send_at = (datetime.now(UTC) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S%z")
        created = await http.post(
            "/api/campaigns/trigger",
            json={
                "campaign_id": tenant.campaign_id,
                "send_at": send_at,
                "messages": [
                    {"user_id": "u1", "template_variables": {"first_name": "A", "order_id": "1"}}
                ],
            },
        )
        assert created.status_code == 200, created.text
        request_id = created.json()["request_id"]
        run = await wait_for_state(request_id, "SCHEDULED", timeout=30)
        scheduled = await http.get(f"/api/campaigns/{tenant.campaign_id}/request/scheduled")
        assert [r["request_id"] for r in scheduled.json()["requests"]] == [request_id]

        async with get_client() as client:  # the UI's Cancel button
            await client.set_flow_run_state(run.id, Cancelling())
        run = await wait_for_state(request_id, "CANCELLED", timeout=10)

        cancel = await http.put(f"/api/campaigns/request/{request_id}/cancel")
        scheduled = await http.get(f"/api/campaigns/{tenant.campaign_id}/request/scheduled")
        report = await http.get("/api/campaigns/report", params={"request_id": request_id})

    assert (cancel.status_code, cancel.json()) == (
        400,
        {"error_message": "Request already canceled"},
    )
    assert scheduled.json()["requests"] == []
    assert report.json() == {"error_message": "Request not processed yet"}
    assert state_name(run) == "CANCELLED"
    assert load_request(request_id).state.value == "canceled"
