"""What the takeover tests share: a send-now request whose worker is killed, frozen or
cut off mid-chunk, and the checks, counted at the sandbox, that another worker
completes it with nobody missing and at most the messages in flight sent twice."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prefect import get_client
from sqlalchemy import func, select
from sqlmodel import col

from campaign_trigger.config import get_settings
from campaign_trigger.delivery import freeze
from campaign_trigger.services import prefect_runs
from campaign_trigger.services.scheduling import notify_new_request
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import DeliveredChunk, Outcome, Platform
from delivery_support import (
    DeviceSpec,
    Tenant,
    add_csv_request,
    add_devices,
    read_report,
    read_run,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import Sandbox, WorkerFactory
from support import ManagedProcess, holds_sqlite_write_lock


def recorded_so_far(request_id: str) -> tuple[int, int]:
    """(complete chunks, outcome rows) of the request."""
    with session_scope() as session:
        chunks = session.execute(
            select(func.count())
            .select_from(DeliveredChunk)
            .where(col(DeliveredChunk.request_id) == request_id)
        ).scalar_one()
        rows = session.execute(
            select(func.count()).select_from(Outcome).where(col(Outcome.request_id) == request_id)
        ).scalar_one()
    return int(chunks), int(rows)


KILL_USERS = 20_000
KILL_CONCURRENCY = 100
# From the moment to kill on, the sandbox answers each message this late, and the kill
# waits for one more message: it lands with that message's answer held back, on the
# wire. Killed at an arbitrary moment, a worker was once caught while its send slots
# awaited their outcomes' commit: every message sent was recorded, and the test proved
# nothing about sends in flight. A worker frozen while writing needs no hold: the
# outcomes its frozen write holds are sent and not recorded; and with its answers held
# back it writes too seldom for a freeze to catch it writing (CI, 27 Nov: 1,238 tries in
# 5 s).
HOLD_MS = 500
# A worker cut off from Prefect sends at 100 messages a second from then on: without its
# lease it would still be sending when its run is taken over (40 s later in the tests).
CUT_LATENCY_MS = 1000


@dataclass(frozen=True)
class Killed:
    """A request whose worker was SIGKILLed (or frozen) mid-chunk, as it stood once the
    requests already on the wire had landed."""

    worker: ManagedProcess
    request_id: str
    tenant: Tenant
    app_id: str  # the app every user has one device of
    users: list[str]
    tokens: list[str]  # one device each
    chunks: int  # complete chunks
    recorded: int  # outcome rows
    delivered: int  # devices the sandbox reached

    @property
    def in_flight(self) -> int:
        """Messages sent and not recorded: the ones a new run sends again."""
        return self.delivered - self.recorded


@dataclass(frozen=True)
class OneDeviceEach:
    """A send-now CSV request of ``KILL_USERS`` users, each with one device of an app."""

    tenant: Tenant
    app_id: str
    users: list[str]
    tokens: list[str]
    request_id: str


def one_device_each(platform: Platform, *, prefix: str, chunk_size: int) -> OneDeviceEach:
    """:class:`OneDeviceEach` of ``platform``'s app (FCM over HTTP/1.1, or APNs over
    HTTP/2, many streams to a connection), in the outbox."""
    tenant = seed_tenant()
    prefix = f"{prefix}-{uuid.uuid4().hex[:6]}"
    users = [f"{prefix}-u{n}" for n in range(KILL_USERS)]
    app_id = tenant.android if platform is Platform.android else tenant.ios
    tokens = [f"{u}-{platform.value}" for u in users]
    add_devices([DeviceSpec(app_id, f"{t}-d", u, t) for u, t in zip(users, tokens, strict=True)])
    rows = [{"User": u, "first_name": f"N{n}", "order_id": f"O{n}"} for n, u in enumerate(users)]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC), chunk_size=chunk_size)
    notify_new_request(request_id)
    return OneDeviceEach(tenant, app_id, users, tokens, request_id)


def as_it_stands(worker: ManagedProcess, sandbox: Sandbox, request: OneDeviceEach) -> Killed:
    """``request`` as it stands once ``worker`` stopped sending it: recorded, and delivered."""
    chunks, recorded = recorded_so_far(request.request_id)
    delivered = sum(1 for n in sandbox.delivered(request.tokens).values() if n)
    return Killed(
        worker,
        request.request_id,
        request.tenant,
        request.app_id,
        request.users,
        request.tokens,
        chunks,
        recorded,
        delivered,
    )


async def killed_mid_chunk(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    *,
    env: dict[str, str],
    chunk_size: int,
    kill_at: int,
    options: tuple[str, ...] = (),
    until: Callable[[str], Awaitable[bool]] | None = None,
    latency_ms: float = 0,
    halt: Callable[[ManagedProcess], None] = ManagedProcess.kill,
    hold: bool = True,
    platform: Platform = Platform.android,
) -> Killed:
    """A send-now request to one device each (:func:`one_device_each`) to a worker started
    with ``options`` and ``env``, SIGKILLed (or else ``halt``-ed) once the sandbox got
    ``kill_at`` of its messages (and, if given, ``until(request_id)`` holds) and then one
    more, whose answer it holds back ``HOLD_MS`` (at once, not holding, unless ``hold``).
    Up to that moment the sandbox answers each message after ``latency_ms`` (at full speed
    if 0).

    The kill caught sends in flight, at most ``KILL_CONCURRENCY``: a provider's slots are
    shared by every chunk of the process sending to its app (``delivery/sending.py``),
    however many of them run at once.
    """
    worker = start_worker(*options, **env)
    before = len(sandbox.state.deliveries)
    request = one_device_each(platform, prefix="kill", chunk_size=chunk_size)
    request_id = request.request_id

    deadline = time.monotonic() + 120
    latency = sandbox.state.latency_ms
    sandbox.state.configure(latency_ms=latency_ms)
    try:
        while len(sandbox.state.deliveries) - before < kill_at or (
            until is not None and not await until(request_id)
        ):
            assert time.monotonic() < deadline, (
                f"the moment to kill never came ({len(sandbox.state.deliveries) - before} "
                f"of {kill_at} messages):\n{worker.log_tail()}"
            )
            await asyncio.sleep(0.002)
        if hold:
            sandbox.state.configure(latency_ms=max(latency_ms, HOLD_MS))
            held = len(sandbox.state.deliveries)
            while len(sandbox.state.deliveries) == held:
                assert time.monotonic() < deadline, f"no message came to hold:\n{worker.log_tail()}"
                await asyncio.sleep(0.001)
        halt(worker)
        await asyncio.sleep(1.0)  # requests already on the wire land
    finally:
        sandbox.state.configure(latency_ms=latency)
    killed = as_it_stands(worker, sandbox, request)
    assert killed.in_flight > 0, "the kill did not catch any send in flight"
    assert killed.in_flight <= KILL_CONCURRENCY
    return killed


async def taken_over(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    killed: Killed,
    *,
    env: dict[str, str],
    options: tuple[str, ...] = (),
) -> None:
    """A new worker started with ``env`` takes the request over (Prefect marks the run dead:
    no heartbeat) and completes it (:func:`completed_once`)."""
    start_worker(*options, **env)
    await completed_once(sandbox, killed)


async def completed_once(sandbox: Sandbox, killed: Killed) -> None:
    """The request completes. Counted at the sandbox: nobody is missing, at most the
    messages in flight at the kill went twice, each second copy with the first one's
    collapse id; the report has every user once."""
    run = await wait_for_state(killed.request_id, "COMPLETED", "FAILED", timeout=240)
    assert state_name(run) == "COMPLETED", run.state
    counts = sandbox.delivered(killed.tokens)
    assert [t for t, n in counts.items() if n == 0] == []  # nobody missing
    doubled = {t: n for t, n in counts.items() if n > 1}
    assert set(doubled.values()) <= {2}
    assert len(doubled) <= KILL_CONCURRENCY
    per_token = sandbox.state.per_token_collapse  # built anew at each read: read once
    for token in doubled:  # the second copy replaces the first on the device
        per_collapse = per_token[token]
        assert len(per_collapse) == 1, per_collapse
        assert "" not in per_collapse
    print(
        f"killed with {killed.recorded} recorded and {killed.delivered} delivered "
        f"({killed.in_flight} in flight); {len(doubled)} devices got it twice"
    )
    report = read_report(killed.request_id)[killed.app_id]
    assert sorted(r["user_id"] for r in report) == sorted(killed.users)
    assert {r["error_message"] for r in report} == {""}


def in_a_write(worker: ManagedProcess, *, writing: bool) -> None:
    """Freeze ``worker`` while it holds the database's write lock (``writing``), or
    while it does not: SQLite has one writer at a time, so a worker frozen while writing
    makes every other writer (the run that takes its chunk over too) wait until it
    resumes."""
    url = get_settings().database_url
    assert url.startswith("sqlite:///"), url
    database = Path(url.removeprefix("sqlite:///"))
    worker.freeze_when(lambda pid: holds_sqlite_write_lock(pid, database) == writing)


FREEZE_ENV = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}


async def frozen_mid_chunk(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    *,
    writing: bool,
    platform: Platform = Platform.android,
) -> Killed:
    """A worker frozen in its request's second or third chunk, holding the write lock or not."""
    frozen = await killed_mid_chunk(
        start_worker,
        sandbox,
        env=FREEZE_ENV,
        chunk_size=5000,
        kill_at=7_300,
        halt=functools.partial(in_a_write, writing=writing),
        hold=not writing,
        platform=platform,
    )
    # A chunk complete and a later one under way (of four): freezing only while the lock
    # is held (or not) may take retries that carry it from the second chunk into the third.
    assert 1 <= frozen.chunks <= 2, frozen.chunks
    return frozen


async def marked_dead(request_id: str, timeout: float = 120) -> None:
    """Until Prefect has marked the request's run dead (the state may have moved on
    since: a taker's claim)."""
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while time.monotonic() < deadline:
            run = await read_run(request_id)
            if run is not None:
                states = await client.read_flow_run_states(run.id)
                if any(s.name == prefect_runs.DEAD_RUN_STATE_NAME for s in states):
                    return
            await asyncio.sleep(0.5)
    raise AssertionError(f"the run of {request_id} was never marked dead")


def exited_as_frozen(worker: ManagedProcess) -> None:
    assert worker.popen.wait(timeout=10) == freeze.EXIT_CODE, worker.log_tail()
    assert "was frozen for" in worker.log_tail()


async def dead_run_states(request_id: str) -> int:
    """How many times the request's run was marked dead."""
    run = await read_run(request_id)
    assert run is not None
    async with get_client() as client:
        states = await client.read_flow_run_states(run.id)
    return sum(1 for s in states if s.name == prefect_runs.DEAD_RUN_STATE_NAME)
