"""What an operator sees of a running stack (real processes: sandbox, API, worker, the
session's Prefect server): the API's and the worker's ``/metrics`` moving with each event,
JSON log lines with the request id and no token or user id, ``campaign-trigger status``
and ``campaign-trigger requests show``."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from campaign_trigger.services import devices
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Request, RequestState
from integration.client.running_stack import (
    RunningStack,
    SeededTenant,
    eventually,
    running_stack,
    seed_tenant,
    sign_in,
)
from support import VENV_BIN, ManagedProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
VARIABLES = {"first_name": "A", "order_id": "1"}


@pytest.fixture(scope="module")
def worker_metrics() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


@pytest.fixture(scope="module")
def stack(
    deployed_server: ManagedProcess, session_dir: Path, worker_metrics: str
) -> Iterator[RunningStack]:
    port = worker_metrics.removeprefix("http://127.0.0.1:").removesuffix("/metrics")
    env = {"CT_WORKER_METRICS_PORT": port, "CT_LOG_FORMAT": "json", "PREFECT_LOGGING_LEVEL": "INFO"}
    with running_stack(session_dir, extra_env=env) as s:
        eventually(lambda: httpx.get(worker_metrics), retry_on=(httpx.HTTPError,))
        yield s


def scrape(url: str) -> Samples:
    text = httpx.get(url).raise_for_status().text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def create(
    api: str, auth: dict[str, str], tenant: SeededTenant, users: list[str], *, days: int = 0
) -> httpx.Response:
    """Create a request of ``users``, sent now or in ``days``."""
    messages = [{"user_id": user, "template_variables": VARIABLES} for user in users]
    send_at = (datetime.now(UTC) + timedelta(days=days)).isoformat()
    return httpx.post(
        f"{api}/api/campaigns/trigger",
        headers=auth,
        json={"campaign_id": tenant.campaign_id, "messages": messages, "send_at": send_at},
    )


def state_of(request_id: str) -> RequestState:
    with session_scope() as session:
        request = session.get(Request, request_id)
        assert request is not None
        return request.state


def processed(request_id: str) -> None:
    assert state_of(request_id) == RequestState.processed


def cli(stack: RunningStack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "campaign-trigger"), *args],
        env={**stack.processes[0].env, **stack.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_api_metrics_count_creates_accepted_refused_by_reason_and_quota_refusals(
    stack: RunningStack,
) -> None:
    api = stack.api_url
    tenant, spent = seed_tenant(users=1), seed_tenant(users=1, quota=1)
    auth = sign_in(api, tenant)
    before = scrape(f"{api}/metrics")

    # sent tomorrow: no delivery of this test moves the worker's figures of the next one
    accepted = create(api, auth, tenant, tenant.users, days=1)
    assert accepted.status_code == 200, accepted.text
    unknown = httpx.post(
        f"{api}/api/campaigns/trigger",
        headers=auth,
        json={"campaign_id": "no-such-campaign", "messages": []},
    )
    assert unknown.status_code == 400
    assert create(api, {}, tenant, tenant.users).status_code == 401
    viewer = sign_in(api, tenant, email=tenant.viewer_email)
    assert create(api, viewer, tenant, tenant.users).status_code == 403
    spent_auth = sign_in(api, spent)
    assert create(api, spent_auth, spent, spent.users, days=1).status_code == 200
    assert create(api, spent_auth, spent, spent.users, days=1).status_code == 429

    after = scrape(f"{api}/metrics")
    assert moved(before, after, "campaign_trigger_requests_accepted_total") == 2
    refused = "campaign_trigger_requests_refused_total"
    assert moved(before, after, refused, reason="campaign_not_found") == 1
    assert moved(before, after, refused, reason="unauthenticated") == 1
    assert moved(before, after, refused, reason="forbidden") == 1
    assert moved(before, after, refused, reason="quota_exceeded") == 1
    assert moved(before, after, "campaign_trigger_quota_refusals_total") == 1
    assert ("campaign_trigger_outbox_depth", frozenset()) in after
    cancel = f"{api}/api/campaigns/request/{accepted.json()['request_id']}/cancel"
    assert httpx.put(cancel, headers=auth).status_code == 200


def test_a_delivery_moves_the_worker_metrics_and_logs_json_without_tokens_or_user_ids(
    stack: RunningStack, worker_metrics: str
) -> None:
    tenant = seed_tenant(users=1)
    tag = uuid.uuid4().hex[:8]
    flaky, gone, nobody = f"flaky-user-{tag}", f"gone-user-{tag}", f"nobody-{tag}"
    tokens = {flaky: f"flaky-{tag}", gone: f"unregistered-{tag}"}
    with session_scope() as session:
        devices.upsert_devices(
            session=session,
            app_id=tenant.app_id,
            rows=[
                {
                    "device_id": f"device-{user}",
                    "user_id": user,
                    "push_token": token,
                    "opted_in": True,
                    "logged_in": True,
                }
                for user, token in tokens.items()
            ],
        )
    users = [*tenant.users, flaky, gone, nobody]
    before = scrape(worker_metrics)
    send_at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    created = httpx.post(
        f"{stack.api_url}/api/campaigns/trigger",
        headers={**sign_in(stack.api_url, tenant), "X-Request-ID": f"trace-{tag}"},
        json={
            "campaign_id": tenant.campaign_id,
            "send_at": send_at,
            "messages": [{"user_id": user, "template_variables": VARIABLES} for user in users],
        },
    )
    assert created.status_code == 200, created.text
    assert created.headers["X-Request-ID"] == f"trace-{tag}"
    request_id = created.json()["request_id"]

    in_flight = 0.0
    deadline = time.monotonic() + 120
    while state_of(request_id) != RequestState.processed:
        assert time.monotonic() < deadline, stack.logs()
        samples = scrape(worker_metrics)
        in_flight = max(in_flight, samples[("campaign_trigger_runs_in_flight", frozenset())])
        time.sleep(0.1)
    assert in_flight >= 1
    after = scrape(worker_metrics)

    messages = "campaign_trigger_messages_total"
    assert moved(before, after, messages, provider="fcm", outcome="sent") == 2
    assert moved(before, after, messages, provider="fcm", outcome="FPErrTokenUnregistered") == 1
    assert moved(before, after, messages, provider="fcm", outcome="No device for user") == 1
    assert moved(before, after, "campaign_trigger_provider_retries_total", provider="fcm") == 1
    latency = "campaign_trigger_provider_latency_seconds_count"
    assert moved(before, after, latency, provider="fcm") == 4  # ok, flaky twice, unregistered

    def run_ended() -> None:  # the request is marked processed just before its run ends
        assert scrape(worker_metrics)[("campaign_trigger_runs_in_flight", frozenset())] == 0

    eventually(run_ended, timeout=30, every=0.2)

    api_log, worker_log = (
        p.log_path.read_text() for p in stack.processes if p.name in ("api", "worker")
    )
    lines = [json.loads(line) for line in worker_log.splitlines() if line.startswith("{")]
    assert sum(line["request_id"] == request_id for line in lines) >= 3, worker_log[-3000:]
    assert any(
        json.loads(line).get("request_id") == f"trace-{tag}"
        for line in api_log.splitlines()
        if line.startswith("{")
    ), api_log[-3000:]
    for secret in [*users, *tokens.values(), *(f"ok-{user}" for user in tenant.users)]:
        assert secret not in worker_log
        assert secret not in api_log


def test_requests_show_a_processed_request(stack: RunningStack) -> None:
    tenant = seed_tenant(users=2)
    created = create(stack.api_url, sign_in(stack.api_url, tenant), tenant, tenant.users)
    request_id = created.json()["request_id"]
    eventually(lambda: processed(request_id), timeout=120)

    shown = cli(stack, "requests", "show", request_id)

    assert shown.returncode == 0, shown.stderr
    assert f"request     {request_id}" in shown.stdout
    assert "state       processed" in shown.stdout
    assert "  sent: 2" in shown.stdout
    assert "/runs/flow-run/" in shown.stdout
    assert f"/files/reports/{request_id}/{tenant.app_id}.csv?" in shown.stdout
    unknown = cli(stack, "requests", "show", "no-such-request")
    assert unknown.returncode == 1
    assert "The request no-such-request was not found" in unknown.stderr


def test_status_shows_every_part_and_exits_1_saying_prefect_is_down(stack: RunningStack) -> None:
    tenant = seed_tenant(users=1)
    auth = sign_in(stack.api_url, tenant)
    created = create(stack.api_url, auth, tenant, tenant.users, days=1)
    assert created.status_code == 200, created.text

    up = cli(stack, "status")

    assert up.returncode == 0, up.stdout + up.stderr
    assert "database    ok" in up.stdout
    assert "storage     ok" in up.stdout
    assert "prefect     ok" in up.stdout
    assert "outbox      " in up.stdout
    assert re.search(r"^webhooks    \d+ waiting ", up.stdout, re.MULTILINE), up.stdout
    online = re.search(r"^workers     (\d+) online ", up.stdout, re.MULTILINE)
    assert online is not None, up.stdout
    assert int(online.group(1)) >= 2  # the worker's two: requests and chunks queues
    assert f"  {tenant.campaign_id}  1" in up.stdout

    down = cli(stack, "status", PREFECT_API_URL=f"http://127.0.0.1:{free_port()}/api")

    assert down.returncode == 1
    assert "Prefect is down" in down.stderr
    assert "prefect     DOWN: " in down.stdout
    assert "database    ok" in down.stdout
    assert "workers     unknown (Prefect is down)" in down.stdout
    assert f"  {tenant.campaign_id}  1" in down.stdout
    request_id = created.json()["request_id"]
    cancel = f"{stack.api_url}/api/campaigns/request/{request_id}/cancel"
    assert httpx.put(cancel, headers=auth).status_code == 200
