"""A delivery step that fails on the way (a storage or database hiccup) is retried as a
Prefect task retry, shown in the UI; one the service refused on purpose is not."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from sqlalchemy.exc import OperationalError

from campaign_trigger.errors import RequestStateError
from campaign_trigger.services import message_file, outcome_log
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.models import RequestState
from delivery_support import (
    add_devices,
    add_request,
    bulk_audience,
    load_request,
    recorded_task_runs,
    sandbox_stats,
    seed_tenant,
    state_name,
    wait_for_state,
)

pytestmark = [pytest.mark.slow]


def failing_once(monkeypatch: pytest.MonkeyPatch, error: Exception) -> list[int]:
    """Make the first read of a chunk raise ``error``; the reads' chunk numbers."""
    read_chunk: Callable[..., Any] = message_file.read_chunk
    reads: list[int] = []

    def read_failing_once(**kwargs: Any) -> Any:
        reads.append(kwargs["chunk_no"])
        if len(reads) == 1:
            raise error
        return read_chunk(**kwargs)

    monkeypatch.setattr(message_file, "read_chunk", read_failing_once)
    return reads


async def send_now(sandbox_url: str, *, users: int) -> tuple[str, FlowRun, dict[str, int]]:
    """A send-now request to ``users`` new users (two devices each), once its run ended:
    its id, its run, and how many messages the sandbox got for each of its devices."""
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=users, prefix=uuid.uuid4().hex[:6])
    add_devices(audience.devices)
    request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
    notify_new_request(request_id)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    per_token = sandbox_stats(sandbox_url)["per_token"]
    tokens = {device.token for device in audience.devices}
    return request_id, run, {token: n for token, n in per_token.items() if token in tokens}


async def chunk_task_states(flow_run_id: str) -> tuple[int, list[str]]:
    """The ``deliver chunk`` task run's run count and the names of its states, in order."""
    [chunk] = [
        task_run
        for task_run in await recorded_task_runs(
            [uuid.UUID(flow_run_id)],
            lambda runs: any(
                r.name.startswith("deliver chunk") and r.state and r.state.is_final() for r in runs
            ),
        )
        if task_run.name.startswith("deliver chunk")
    ]
    async with get_client() as client:
        states = await client.read_task_run_states(chunk.id)
    return chunk.run_count, [state.name for state in sorted(states, key=lambda s: s.timestamp)]


async def test_a_chunk_whose_storage_fails_once_is_retried_and_each_device_gets_one_message(
    worker: None, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = failing_once(monkeypatch, OSError("storage hiccup"))
    request_id, run, per_token = await send_now(sandbox_url, users=3)

    assert state_name(run) == "COMPLETED", run.state
    assert reads == [0, 0]
    run_count, states = await chunk_task_states(str(run.id))
    assert run_count == 2
    assert states == ["Pending", "Running", "AwaitingRetry", "Retrying", "Completed"]
    assert list(per_token.values()) == [1] * 6  # each device of the 3 users
    assert load_request(request_id).state == RequestState.processed


async def test_a_chunk_refused_on_purpose_is_not_retried(
    worker: None, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = failing_once(monkeypatch, RequestStateError("Request already canceled"))
    request_id, run, per_token = await send_now(sandbox_url, users=2)

    assert state_name(run) == "FAILED", run.state
    assert reads == [0]
    run_count, states = await chunk_task_states(str(run.id))
    assert run_count == 1
    assert states == ["Pending", "Running", "Failed"]
    assert per_token == {}
    assert load_request(request_id).state == RequestState.failed


async def test_a_chunk_whose_answers_cannot_be_recorded_is_not_retried_and_sends_none_twice(
    worker: None, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database fails the first batch of answers, after their messages were sent: a
    retry would send them again (they are not recorded), so the run fails instead."""
    commit = outcome_log._commit
    failed: list[int] = []

    def commit_failing_once(session: Any, rows: Any, **kwargs: Any) -> None:
        if rows and not failed:
            failed.append(len(rows))
            raise OperationalError("INSERT INTO outcome", {}, OSError("database unreachable"))
        commit(session, rows, **kwargs)

    monkeypatch.setattr(outcome_log, "_commit", commit_failing_once)
    reads = failing_once(monkeypatch, OSError("storage hiccup"))  # retried: before any send
    request_id, run, per_token = await send_now(sandbox_url, users=20)

    assert state_name(run) == "FAILED", run.state
    assert reads == [0, 0]
    assert failed
    run_count, states = await chunk_task_states(str(run.id))
    assert run_count == 2
    assert states == ["Pending", "Running", "AwaitingRetry", "Retrying", "Failed"]
    assert set(per_token.values()) == {1}  # some sent, none twice
    assert load_request(request_id).state == RequestState.failed
