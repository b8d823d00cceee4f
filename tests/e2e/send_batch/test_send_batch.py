"""The send-batch flow end to end: from Python, and through the Prefect API with the
JSON the UI form posts, served by ``campaign-trigger runner``; deliveries by a real
``campaign-trigger worker`` to the sandbox providers; reports through the real API."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.objects import FlowRun, StateType
from sqlmodel import col, select

from campaign_trigger.config import get_settings
from campaign_trigger.flows import send_batch
from campaign_trigger.flows.send_batch import Message, SendBatchInput
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage
from campaign_trigger.store.models import Request, RequestState
from integration.client.running_stack import (
    RunningStack,
    SeededTenant,
    eventually,
    running_stack,
    seed_tenant,
    write_batch_csv,
)
from support import VENV_BIN, ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPORT_HEADER = "app_id,campaign_id,user_id,device_id,sent_at,request_id,channel,error_message"


@pytest.fixture(scope="module")
def stack(prefect_server: ManagedProcess, session_dir: Path) -> Iterator[RunningStack]:
    with running_stack(session_dir) as s:
        runner = ManagedProcess(
            "runner",
            [str(VENV_BIN / "campaign-trigger"), "runner"],
            env=s.env,
            log_dir=session_dir,
        )
        s.processes.append(runner)
        yield s


@pytest.fixture
def same_settings_as_stack(stack: RunningStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process signs links for the stack's API, as its own processes do."""
    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def prefect() -> SyncPrefectClient:
    return get_client(sync_client=True)


def deployment_id(name: str, timeout: float = 90) -> UUID:
    def found() -> UUID:
        with prefect() as client:
            try:
                return client.read_deployment_by_name(name).id
            except Exception as exc:
                raise AssertionError(f"{name} not served yet") from exc

    return eventually(found, timeout=timeout, every=1)


def create_run_like_the_ui(deployment: str, parameters: dict[str, Any]) -> httpx.Response:
    """POST the body the Prefect UI's run form posts."""
    from prefect.settings import PREFECT_API_URL

    dep_id = deployment_id(deployment)
    body = {
        "parameters": parameters,
        "state": {"type": "SCHEDULED", "message": "Run from the Prefect UI"},
        "tags": [],
        "job_variables": {},
    }
    url = f"{PREFECT_API_URL.value()}/deployments/{dep_id}/create_flow_run"
    for _attempt in range(8):  # a SQLite-backed server answers 503 while its database is busy
        response = httpx.post(url, json=body, timeout=30)
        if response.status_code != 503:
            break
        time.sleep(1)
    return response


def final_run(flow_run_id: str, timeout: float = 120) -> FlowRun:
    deadline = time.monotonic() + timeout
    while True:
        with prefect() as client:
            run = client.read_flow_run(UUID(flow_run_id))
        if run.state is not None and run.state.is_final():
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run.name} still {run.state_name}")
        time.sleep(0.5)


def request_of_run(run: FlowRun) -> str:
    assert run.name.startswith("send "), run.name
    return run.name.removeprefix("send ")


def wait_processed(request_id: str, timeout: float = 90) -> Request:
    def processed() -> Request:
        with session_scope() as session:
            request = session.get(Request, request_id)
        assert request is not None
        assert request.state == RequestState.processed, request.state
        return request

    return eventually(processed, timeout=timeout)


def messages(tenant: SeededTenant) -> list[dict[str, Any]]:
    return [
        {"user_id": u, "template_variables": {"first_name": f"N{n}", "order_id": f"O{n}"}}
        for n, u in enumerate(tenant.users)
    ]


def report_rows(link: str) -> list[list[str]]:
    response = httpx.get(link, timeout=30)
    assert response.status_code == 200, response.text
    return list(csv.reader(io.StringIO(response.text)))


def test_send_batch_from_python_waits_and_returns_the_report_links(
    stack: RunningStack, same_settings_as_stack: None
) -> None:
    tenant = seed_tenant()
    batch = SendBatchInput(
        campaign_id=tenant.campaign_id,
        messages=[Message.model_validate(m) for m in messages(tenant)],
    )
    result = send_batch(batch, wait=True)
    assert len(result.reports) == 1
    rows = report_rows(result.reports[0])
    assert ",".join(rows[0]) == REPORT_HEADER
    assert sorted(r[2] for r in rows[1:]) == sorted(tenant.users)
    assert {r[5] for r in rows[1:]} == {result.request_id}
    assert {r[7] for r in rows[1:]} == {""}
    with session_scope() as session:
        request = session.get(Request, result.request_id)
    assert request is not None
    assert request.org_id is not None
    assert request.message_count == len(tenant.users)


def test_a_call_that_stored_its_batch_names_the_request_when_the_wait_fails(
    stack: RunningStack, same_settings_as_stack: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.exceptions import ObjectNotFound

    from campaign_trigger.tasks import send_batch as steps

    async def lost(_request_id: str) -> None:
        raise ObjectNotFound(Exception("404"))  # what the Prefect client raised in issue 17

    monkeypatch.setattr(steps, "_final_state", lost)
    tenant = seed_tenant()
    batch = SendBatchInput(
        campaign_id=tenant.campaign_id,
        messages=[Message.model_validate(m) for m in messages(tenant)],
    )
    with pytest.raises(Exception, match="is stored and will be delivered") as raised:
        send_batch(batch, wait=True)
    [request_id] = re.findall(r"The request (\w+) is stored", str(raised.value))
    assert "do not send it again" in str(raised.value)
    request = wait_processed(request_id)  # it was sent: the error said so
    assert request.campaign_id == tenant.campaign_id


def test_the_ui_form_json_creates_a_request_that_is_delivered_with_a_report(
    stack: RunningStack, same_settings_as_stack: None
) -> None:
    tenant = seed_tenant()
    send_at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    response = create_run_like_the_ui(
        "send-batch/send-batch",
        {
            "batch": {
                "campaign_id": tenant.campaign_id,
                "send_at": send_at,
                "messages": messages(tenant),
            }
        },
    )
    assert response.status_code == 201, response.text
    run = final_run(response.json()["id"])
    assert run.state_type == StateType.COMPLETED, (run.state, stack.logs())
    assert f"campaign:{tenant.campaign_id}" in run.tags
    request_id = request_of_run(run)
    request = wait_processed(request_id)
    assert len(request.report_paths) == 1
    with get_storage(get_settings()).open(request.report_paths[0], "rb") as handle:
        lines = handle.read().decode().splitlines()
    assert lines[0] == REPORT_HEADER
    assert len(lines) == 1 + len(tenant.users)
    with prefect() as client:  # the delivery run: named after the request, tagged
        delivery = client.read_flow_run(UUID(request.flow_run_id or ""))
    assert delivery.name == request_id
    assert f"campaign:{tenant.campaign_id}" in delivery.tags


def test_a_csv_in_storage_named_by_date_is_sent_by_the_daily_deployment(
    stack: RunningStack, same_settings_as_stack: None, tmp_path: Path
) -> None:
    tenant = seed_tenant()
    today = datetime.now(UTC).date().isoformat()
    storage = get_storage(get_settings())
    source = write_batch_csv(tmp_path / "daily.csv", tenant.users)
    with storage.open(f"incoming/{tenant.campaign_id}/{today}.csv", "wb") as handle:
        handle.write(source.read_bytes())
    response = create_run_like_the_ui(
        "send-batch/daily-csv-batch",
        {
            "batch": {
                "campaign_id": tenant.campaign_id,
                "csv_path": f"incoming/{tenant.campaign_id}/{{date}}.csv",
            }
        },
    )
    assert response.status_code == 201, response.text
    run = final_run(response.json()["id"])
    assert run.state_type == StateType.COMPLETED, (run.state, stack.logs())
    request = wait_processed(request_of_run(run))
    assert request.message_count == len(tenant.users)
    assert request.source == "csv"


def refused_run(parameters: dict[str, Any]) -> tuple[FlowRun, str]:
    response = create_run_like_the_ui("send-batch/send-batch", parameters)
    assert response.status_code == 201, response.text
    run = final_run(response.json()["id"])
    with prefect() as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    refused = [a for a in artifacts if a.key == "send-batch-refused"]
    assert len(refused) == 1, artifacts
    assert refused[0].type == "markdown"
    return run, str(refused[0].data)


def test_refused_input_fails_the_run_with_the_spec_error_in_an_artifact(
    stack: RunningStack,
) -> None:
    tenant = seed_tenant()
    before = _request_count(tenant.campaign_id)
    run, markdown = refused_run(
        {
            "batch": {
                "campaign_id": tenant.campaign_id,
                "messages": [{"user_id": "u1", "template_variables": {"first_name": "A"}}],
            }
        }
    )
    assert run.state_type == StateType.FAILED
    assert run.state is not None
    assert "Invalid file : missing variables : (order_id)" in (run.state.message or "")
    assert "## Validation problems" in markdown
    assert "- Invalid file : missing variables : (order_id)" in markdown
    assert "u1" not in markdown  # no personal data in what the UI shows

    run, markdown = refused_run(
        {"batch": {"campaign_id": "no-such-campaign", "csv_path": "incoming/x.csv"}}
    )
    assert run.state_type == StateType.FAILED
    assert "- Unknown campaign with identifier no-such-campaign" in markdown

    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    run, markdown = refused_run(
        {
            "batch": {
                "campaign_id": tenant.campaign_id,
                "send_at": past,
                "messages": messages(tenant),
            }
        }
    )
    assert "- The delivery time is in the past, please change it" in markdown
    assert _request_count(tenant.campaign_id) == before  # nothing was stored


def test_the_server_rejects_malformed_form_input_before_any_run(stack: RunningStack) -> None:
    both = {"batch": {"campaign_id": "c", "csv_path": "x.csv", "messages": [{"user_id": "u"}]}}
    neither = {"batch": {"campaign_id": "c"}}
    blank = {"batch": {"campaign_id": "", "csv_path": "x.csv"}}
    for parameters in (both, neither, blank):
        response = create_run_like_the_ui("send-batch/send-batch", parameters)
        assert response.status_code == 409, (parameters, response.text)
        assert "Validation failed" in response.text


def test_a_python_call_with_both_sources_is_refused_with_the_spec_text(
    stack: RunningStack,
) -> None:
    tenant = seed_tenant()
    batch = SendBatchInput(
        campaign_id=tenant.campaign_id,
        messages=[Message.model_validate(m) for m in messages(tenant)],
        csv_path="incoming/x.csv",
    )
    with pytest.raises(Exception, match="Must provide either JSON messages or a CSV file"):
        send_batch(batch)


def _request_count(campaign_id: str) -> int:
    with session_scope() as session:
        return len(
            session.exec(select(Request.id).where(col(Request.campaign_id) == campaign_id)).all()
        )
