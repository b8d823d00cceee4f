"""prefect.yaml: generated from the deployment catalog; ``prefect --no-prompt deploy
--all`` against a real Prefect server creates every deployment with its parameter
schema, work pool, pull step and schedules; a process worker runs one; and the runner
serves the same deployments."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import ObjectAlreadyExists

from campaign_trigger.deployments.catalog import DEPLOYMENTS, prefect_yaml
from campaign_trigger.deployments.runner import deployments as runner_deployments
from support import REPO, VENV_BIN, ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POOLS = ("campaign-trigger", "campaign-trigger-delivery")
EXPECTED = {
    "deliver-request/default": "campaign-trigger-delivery",
    "send-batch/send-batch": "campaign-trigger",
    "send-batch/daily-csv-batch": "campaign-trigger",
    "purge-files/purge-files": "campaign-trigger",
    "reconcile/reconcile": "campaign-trigger",
    "settle-in-progress/settle-in-progress": "campaign-trigger",
}
PULL = [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $CT_CODE_DIR }}"}}]


async def _create_pools() -> None:
    async with get_client() as client:
        for name in POOLS:
            with contextlib.suppress(ObjectAlreadyExists):
                await client.create_work_pool(WorkPoolCreate(name=name, type="process"))


async def _read(names: list[str]) -> dict[str, DeploymentResponse]:
    async with get_client() as client:
        return {name: await client.read_deployment_by_name(name) for name in names}


@pytest.fixture(scope="module")
def deployed(prefect_server: ManagedProcess) -> dict[str, DeploymentResponse]:
    asyncio.run(_create_pools())
    started = time.monotonic()
    result = subprocess.run(
        [str(VENV_BIN / "prefect"), "--no-prompt", "deploy", "--all"],
        cwd=REPO,
        # CT_CODE_DIR is read on the worker when a run starts; prefect deploy renders
        # it into the first deployment's pull step if set here, so it is not
        env={k: v for k, v in os.environ.items() if k != "CT_CODE_DIR"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logging.getLogger(__name__).warning(
        "prefect deploy --all took %.1f s", time.monotonic() - started
    )
    return asyncio.run(_read(list(EXPECTED)))


def test_every_deployment_is_created_on_its_work_pool_with_the_pull_step(
    deployed: dict[str, DeploymentResponse],
) -> None:
    for name, pool in EXPECTED.items():
        deployment = deployed[name]
        assert deployment.work_pool_name == pool, name
        assert deployment.pull_steps == PULL, name
        assert "campaign-trigger" in (deployment.tags or []), name
        assert deployment.enforce_parameter_schema, name
        assert (deployment.entrypoint or "").startswith("src/campaign_trigger/flows/"), name


def test_each_deployment_has_its_parameter_schema(
    deployed: dict[str, DeploymentResponse],
) -> None:
    def properties(name: str) -> dict[str, Any]:
        schema = deployed[name].parameter_openapi_schema or {}
        return dict(schema.get("properties", {}))

    assert set(properties("deliver-request/default")) == {"request_id"}
    for name in ("send-batch/send-batch", "send-batch/daily-csv-batch"):
        schema = deployed[name].parameter_openapi_schema or {}
        assert set(properties(name)) == {"batch", "wait", "wait_timeout_seconds", "dry_run"}
        assert properties(name)["dry_run"]["default"] is False
        assert "nothing is stored" in properties(name)["dry_run"]["description"]
        assert schema["required"] == ["batch"]
        batch = schema["definitions"]["SendBatchInput"]
        assert set(batch["properties"]) == {"campaign_id", "send_at", "messages", "csv_path"}
        assert all(p.get("description") for p in batch["properties"].values())
        assert [branch["required"] for branch in batch["oneOf"]] == [["messages"], ["csv_path"]]
        assert "Message" in schema["definitions"]
    assert set(properties("purge-files/purge-files")) == {"older_than_days"}
    assert properties("reconcile/reconcile") == {}
    assert set(properties("settle-in-progress/settle-in-progress")) == {"older_than_minutes"}


def test_schedules_are_deployed_and_the_daily_example_is_inactive(
    deployed: dict[str, DeploymentResponse],
) -> None:
    def crons(name: str) -> list[tuple[str, bool]]:
        return [(getattr(s.schedule, "cron", ""), s.active) for s in deployed[name].schedules]

    assert crons("deliver-request/default") == []
    assert crons("send-batch/send-batch") == []
    assert crons("send-batch/daily-csv-batch") == [("0 7 * * *", False)]
    assert crons("purge-files/purge-files") == [("30 3 * * *", True)]
    assert crons("reconcile/reconcile") == [("*/10 * * * *", True)]
    assert crons("settle-in-progress/settle-in-progress") == [("15 * * * *", True)]
    assert deployed["send-batch/daily-csv-batch"].parameters == {
        "batch": {"campaign_id": "demo-campaign", "csv_path": "incoming/demo-campaign/{date}.csv"}
    }


def test_a_process_worker_runs_a_deployed_flow_through_the_pull_step(
    deployed: dict[str, DeploymentResponse], session_dir: Path
) -> None:
    async def run_reconcile() -> UUID:
        async with get_client() as client:
            run = await client.create_flow_run_from_deployment(deployed["reconcile/reconcile"].id)
            return run.id

    async def state_of(run_id: UUID) -> StateType | None:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            return run.state.type if run.state else None

    run_id = asyncio.run(run_reconcile())
    worker = ManagedProcess(
        "prefect-worker",
        [str(VENV_BIN / "prefect"), "worker", "start", "--pool", "campaign-trigger", "--run-once"],
        env={"CT_CODE_DIR": str(REPO), "PREFECT_LOGGING_LEVEL": "INFO"},
        log_dir=session_dir,
        cwd=session_dir,
    )
    try:
        deadline = time.monotonic() + 120
        state = None
        while time.monotonic() < deadline:
            state = asyncio.run(state_of(run_id))
            if state in (StateType.COMPLETED, StateType.FAILED, StateType.CRASHED):
                break
            time.sleep(1)
        assert state == StateType.COMPLETED, worker.log_tail(80)
    finally:
        worker.stop()


def _wait_for_state(run_id: UUID, process: ManagedProcess, timeout: float = 120) -> None:
    async def state_of() -> StateType | None:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            return run.state.type if run.state else None

    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = asyncio.run(state_of())
        if state in (StateType.COMPLETED, StateType.FAILED, StateType.CRASHED):
            break
        time.sleep(1)
    assert state == StateType.COMPLETED, process.log_tail(80)


def test_the_runner_takes_over_deployments_made_by_prefect_deploy(
    deployed: dict[str, DeploymentResponse], session_dir: Path
) -> None:
    async def taken_over() -> bool:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("reconcile/reconcile")
            return bool(deployment.path) and not deployment.pull_steps

    async def run_reconcile() -> UUID:
        async with get_client() as client:
            run = await client.create_flow_run_from_deployment(deployed["reconcile/reconcile"].id)
            return run.id

    runner = ManagedProcess(
        "runner", [str(VENV_BIN / "campaign-trigger"), "runner"], log_dir=session_dir
    )
    try:
        deadline = time.monotonic() + 90
        while not asyncio.run(taken_over()):
            assert time.monotonic() < deadline, runner.log_tail(60)
            time.sleep(1)
        _wait_for_state(asyncio.run(run_reconcile()), runner)
    finally:
        runner.stop()


def test_prefect_yaml_is_what_the_catalog_generates() -> None:
    """One declaration: the committed prefect.yaml is the catalog's (regenerate it with
    ``campaign-trigger deployments yaml > prefect.yaml``)."""
    assert (REPO / "prefect.yaml").read_text() == prefect_yaml()


def test_the_runner_serves_the_catalog_but_the_delivery() -> None:
    served = {d.name: d for d in runner_deployments()}
    assert set(served) == {d.name for d in DEPLOYMENTS} - {"default"}
    spec = yaml.safe_load(prefect_yaml())
    in_yaml = {d["name"]: d for d in spec["deployments"]}
    for name, deployment in served.items():
        declared = in_yaml[name]
        assert deployment.entrypoint is not None
        assert deployment.entrypoint.split(":")[-1] == declared["entrypoint"].split(":")[-1]
        assert deployment.parameters or declared.get("parameters", {}) == {}
        schedules = [
            (getattr(s.schedule, "cron", None), s.active, s.slug)
            for s in deployment.schedules or []
        ]
        assert schedules == [(s["cron"], s["active"], s["slug"]) for s in declared["schedules"]]
