"""Scale-out, end to end on PostgreSQL (the service's database and Prefect's): two worker
processes share a 200 k-recipient request; then one is SIGKILLed mid-request (the one
running the request's own run, while chunks are in flight) and the other finishes it
(a request of 100 k: two shares, one the killed worker's own, are enough for that; half
the calm request's messages took the test from 357 to 272 s on a slow machine, most of
what is left of the phase being the wait for Prefect to find the dead run).

Counted at the sandbox: every device got its message, none twice in the calm run, and
at most the sends in flight at the kill twice (the second copy with the first's collapse
identity), never more.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    TaskRunFilter,
    TaskRunFilterName,
)

from campaign_trigger.config import get_settings
from campaign_trigger.services import prefect_runs
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from delivery_support import (
    DeviceSpec,
    Tenant,
    add_csv_request,
    add_devices,
    load_request,
    read_report,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import Sandbox, WorkerFactory
from support import ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

USERS = 200_000
KILLED_USERS = 100_000  # the request of the kill: 20 chunks, two shares
CONCURRENCY = 100  # sends in flight per app and worker process


@pytest.fixture
def service_on_postgres(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The service's database on PostgreSQL for this test and the workers it starts."""
    monkeypatch.setenv("CT_DATABASE_URL", postgres_url)
    get_settings.cache_clear()
    upgrade(postgres_url)
    yield postgres_url
    engine_for(postgres_url).dispose()
    get_settings.cache_clear()


def _start_two(start_worker: WorkerFactory, database_url: str) -> list[ManagedProcess]:
    env = {"CT_DATABASE_URL": database_url, "CT_DELIVERY_CONCURRENCY": str(CONCURRENCY)}
    return [start_worker(**env), start_worker(**env)]


def _request(tenant: Tenant, users: list[str]) -> str:
    rows = [{"User": u, "first_name": f"N{n}", "order_id": f"O{n}"} for n, u in enumerate(users)]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC))
    notify_new_request(request_id)
    return request_id


async def _claimer(client: PrefectClient, run_id: uuid.UUID) -> str:
    """The worker process that claimed the run last (its claim names it)."""
    states = await client.read_flow_run_states(run_id)
    claims = [
        s.message.removeprefix(prefect_runs.WORKER_CLAIM_PREFIX)
        for s in states
        if s.type.value == "PENDING"
        and s.message
        and s.message.startswith(prefect_runs.WORKER_CLAIM_PREFIX)
    ]
    return claims[-1].removesuffix("-chunks").removesuffix("-default")


async def _chunks_by_worker(request_id: str) -> dict[str, list[int]]:
    """Worker process -> the chunks it delivered, from Prefect's run records: those of
    the request's run (its own shares) and of each deliver-chunks subflow, each with
    the worker whose claim of it is the last."""
    run = await wait_for_state(request_id, "COMPLETED", timeout=1)
    by_worker: dict[str, list[int]] = {}
    async with get_client() as client:
        shares = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])
            )
        )
        own = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="deliver chunk")),
        )
        by_worker[await _claimer(client, run.id)] = [
            int(t.name.split()[-1].split("/")[0]) - 1 for t in own
        ]
        for share in shares:
            assert share.state is not None
            assert share.state.type.value == "COMPLETED", share.state
            process = await _claimer(client, share.id)
            by_worker.setdefault(process, []).extend(share.parameters["chunk_nos"])
    return by_worker


def _counts(sandbox: Sandbox, tokens: list[str], before: dict[str, int]) -> dict[str, int]:
    now = sandbox.delivered(tokens)
    return {t: now[t] - before.get(t, 0) for t in tokens}


async def test_two_workers_share_a_large_request_and_one_finishes_what_a_killed_one_began(
    service_on_postgres: str, start_worker: WorkerFactory, sandbox: Sandbox
) -> None:
    workers = _start_two(start_worker, service_on_postgres)
    tenant = seed_tenant()
    prefix = f"scale-{uuid.uuid4().hex[:6]}"
    users = [f"{prefix}-u{n}" for n in range(USERS)]
    tokens = [f"{u}-t" for u in users]
    add_devices([DeviceSpec(tenant.android, f"{u}-a", u, f"{u}-t") for u in users])
    chunk_count = USERS // get_settings().chunk_size

    # 1. Calm: both workers deliver chunks; the report is complete; each device once.
    before = sandbox.delivered(tokens)
    started = time.monotonic()
    request_id = _request(tenant, users)
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=600)
    assert state_name(run) == "COMPLETED", run.state
    took = time.monotonic() - started
    by_worker = await _chunks_by_worker(request_id)
    assert len(by_worker) == 2, by_worker  # both worker processes delivered chunks
    assert all(by_worker.values()), by_worker
    # every chunk once: in the request's run or in one share run
    assert sorted(c for chunks in by_worker.values() for c in chunks) == list(range(chunk_count))
    report = read_report(request_id)[tenant.android]
    assert len(report) == USERS
    assert {r["error_message"] for r in report} == {""}
    counts = _counts(sandbox, tokens, before)
    assert set(counts.values()) == {1}  # each device once
    print(
        f"{USERS} recipients in {took:.1f} s on two workers: "
        + ", ".join(f"{len(chunks)} chunks" for chunks in by_worker.values())
    )

    # 2. Kill the worker running the request's own run, mid-chunk, at full speed.
    users, tokens = users[:KILLED_USERS], tokens[:KILLED_USERS]
    before = sandbox.delivered(tokens)
    request_id = _request(tenant, users)
    deadline = time.monotonic() + 300
    while sum(_counts(sandbox, tokens[::97], before).values()) < len(tokens[::97]) // 3:
        assert time.monotonic() < deadline, "delivery did not get going"
        await asyncio.sleep(0.05)
    owner = load_request(request_id).run_owner
    victim = next(w for w in workers if owner and _pid_name(w) in owner)
    victim.kill()
    await asyncio.sleep(1.0)  # requests already on the wire land

    # Crashed is a passing state here: the survivor takes the crashed run over.
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", timeout=600)
    assert state_name(run) == "COMPLETED", run.state
    assert len(read_report(request_id)[tenant.android]) == KILLED_USERS
    counts = _counts(sandbox, tokens, before)
    assert [t for t, n in counts.items() if n == 0] == []  # nobody missing
    doubled = {t: n for t, n in counts.items() if n > 1}
    assert set(doubled.values()) <= {2}
    assert len(doubled) <= CONCURRENCY  # only the sends in flight in the killed process
    per_token = sandbox.state.per_token_collapse  # built anew at each read: read once
    for token in doubled:  # the calm run's copy, then this run's two with one identity
        assert sorted(per_token[token].values()) == [1, 2]
    print(f"killed {owner} mid-request: {len(doubled)} devices got it twice")


def _pid_name(worker: ManagedProcess) -> str:
    return f"-{worker.popen.pid}-"  # worker names are <host>-<pid>-<random>
