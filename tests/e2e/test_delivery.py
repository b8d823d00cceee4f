"""End to end: outbox -> Prefect server -> worker process -> sandbox -> report files."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
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
    add_request,
    bulk_audience,
    every_outcome_audience,
    read_report,
    read_run,
    seed_tenant,
    state_name,
    wait_for_state,
)
from e2e.conftest import Sandbox, WorkerFactory
from support import ManagedProcess, holds_sqlite_write_lock, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXPECTED = {
    ("ok", "and"): "",
    ("ok", "ios"): "",
    ("flaky", "and"): "",
    ("unreg", "and"): "FPErrTokenUnregistered",
    ("expired", "ios"): "FPErrBadRecipientToken",
    ("invalid", "and"): "FPErrBadRecipientToken",
    ("fail", "and"): "FPErrPushFailed",
    ("optout", "and"): "Opt out",
    ("loggedout", "ios"): "Last user not logged in",
    ("gone", "and"): "App uninstalled",
    ("nodevice", "and"): "No device for user",
    ("nodevice", "ios"): "No device for user",
}


async def test_a_request_scheduled_ahead_stays_scheduled_then_is_delivered(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    start_worker()
    tenant = seed_tenant()
    audience = every_outcome_audience(tenant)
    add_devices(audience.devices)
    send_at = datetime.now(UTC) + timedelta(seconds=5)
    request_id = add_request(tenant, audience.users, send_at=send_at)
    notify_new_request(request_id)

    run = await wait_for_state(request_id, "SCHEDULED", timeout=4)
    # A worker claims a run scheduled ahead at most its prefetch (2 s) before its time.
    await asyncio.sleep(max(0.0, (send_at - datetime.now(UTC)).total_seconds() - 3))
    run = await read_run(request_id)  # type: ignore[assignment]
    assert run.state is not None
    assert run.state.type.value == "SCHEDULED"
    assert not any(sandbox.delivered([d.token for d in audience.devices if d.token]).values())

    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=60)
    assert state_name(run) == "COMPLETED", run.state
    reports = read_report(request_id)
    rows = [row for app_rows in reports.values() for row in app_rows]
    outcomes = {(r["user_id"].split("-")[1], r["app_id"][:3]): r["error_message"] for r in rows}
    assert outcomes == EXPECTED
    # One row per device; the user with no device at all once in each app's report.
    assert len(rows) == len(audience.devices) + 2
    for row in rows:
        if row["sent_at"]:
            assert datetime.fromisoformat(row["sent_at"]) >= send_at  # never before send_at
    delivered = sandbox.delivered([d.token for d in audience.devices if d.token])
    flaky = next(d.token for d in audience.devices if "flaky" in d.device_id)
    assert flaky is not None
    assert delivered[flaky] == 1
    assert sum(delivered.values()) == 3  # ok x2 and flaky, each exactly once
    # The run's logs reach the Prefect UI from the worker process (its own log set-up
    # keeps Prefect's handler of run logs).
    assert any(line.startswith("report: ") for line in await _run_logs(run.id, "report: "))


async def _run_logs(flow_run_id: uuid.UUID, awaited: str, timeout: float = 20) -> list[str]:
    """The run's log lines in Prefect, once one starts with ``awaited`` (they are posted
    in batches) or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while True:
            found = await client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
            lines = [log.message for log in found]
            if any(line.startswith(awaited) for line in lines) or time.monotonic() > deadline:
                return lines
            await asyncio.sleep(0.5)


def _recorded(request_id: str) -> tuple[int, int]:
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


def _one_device_each(platform: Platform, *, prefix: str, chunk_size: int) -> OneDeviceEach:
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


def _as_it_stands(worker: ManagedProcess, sandbox: Sandbox, request: OneDeviceEach) -> Killed:
    """``request`` as it stands once ``worker`` stopped sending it: recorded, and delivered."""
    chunks, recorded = _recorded(request.request_id)
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


async def _killed_mid_chunk(
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
    """A send-now request to one device each (:func:`_one_device_each`) to a worker started
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
    request = _one_device_each(platform, prefix="kill", chunk_size=chunk_size)
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
    killed = _as_it_stands(worker, sandbox, request)
    assert killed.in_flight > 0, "the kill did not catch any send in flight"
    assert killed.in_flight <= KILL_CONCURRENCY
    return killed


async def _taken_over(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    killed: Killed,
    *,
    env: dict[str, str],
    options: tuple[str, ...] = (),
) -> None:
    """A new worker started with ``env`` takes the request over (Prefect marks the run dead:
    no heartbeat) and completes it (:func:`_completed_once`)."""
    start_worker(*options, **env)
    await _completed_once(sandbox, killed)


async def _completed_once(sandbox: Sandbox, killed: Killed) -> None:
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


@pytest.mark.parametrize("platform", [Platform.android, Platform.ios])
async def test_a_worker_killed_mid_chunk_resends_at_most_the_messages_in_flight(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    platform: Platform,
) -> None:
    """SIGKILL in the middle of a chunk, while sends are in flight; a new worker takes over.
    Over HTTP/1.1 (FCM) and over HTTP/2 (APNs: the messages in flight are streams of a
    few connections).

    Counted at the sandbox: nobody is missing, at most ``delivery_concurrency`` devices
    got the message twice, and each second copy carried the first one's collapse id.
    """
    env = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}
    # Kill inside the second chunk (rows 5,000-9,999), at full speed.
    killed = await _killed_mid_chunk(
        start_worker, sandbox, env=env, chunk_size=5000, kill_at=7_300, platform=platform
    )
    assert killed.chunks == 1, killed.chunks  # the first chunk complete, the second one under way
    assert 5_000 < killed.recorded < 10_000, killed.recorded
    await _taken_over(start_worker, sandbox, killed, env=env)


def _in_a_write(worker: ManagedProcess, *, writing: bool) -> None:
    """Freeze ``worker`` while it holds the database's write lock (``writing``), or
    while it does not: SQLite has one writer at a time, so a worker frozen while writing
    makes every other writer (the run that takes its chunk over too) wait until it
    resumes."""
    url = get_settings().database_url
    assert url.startswith("sqlite:///"), url
    database = Path(url.removeprefix("sqlite:///"))
    worker.freeze_when(lambda pid: holds_sqlite_write_lock(pid, database) == writing)


FREEZE_ENV = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}


async def _frozen_mid_chunk(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    *,
    writing: bool,
    platform: Platform = Platform.android,
) -> Killed:
    """A worker frozen in its request's second or third chunk, holding the write lock or not."""
    frozen = await _killed_mid_chunk(
        start_worker,
        sandbox,
        env=FREEZE_ENV,
        chunk_size=5000,
        kill_at=7_300,
        halt=functools.partial(_in_a_write, writing=writing),
        hold=not writing,
        platform=platform,
    )
    # A chunk complete and a later one under way (of four): freezing only while the lock
    # is held (or not) may take retries that carry it from the second chunk into the third.
    assert 1 <= frozen.chunks <= 2, frozen.chunks
    return frozen


@pytest.mark.parametrize("platform", [Platform.android, Platform.ios])
async def test_a_frozen_worker_whose_run_was_taken_over_exits_as_it_thaws_without_sending(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    platform: Platform,
) -> None:
    """SIGSTOP in the middle of a chunk, between two writes: the run is marked dead and a
    new worker completes it, as after a kill. Then SIGCONT: the frozen worker still holds
    the run and its chunk in memory, and exits before it begins one more send
    (delivery/freeze.py) instead of sending the rest of its chunk a second time.

    At most one message goes out as it thaws: the request the freeze may have caught
    between its transport's check and its write (over HTTP/1.1 seen once in many runs,
    27 Nov). It was in flight at the freeze; unfenced, the rest of the chunk went (2,620
    messages). Over HTTP/2 libcurl writes many streams in one turn: before each body
    was read through a check, 6 and 36 messages went out in two runs of five (28 Nov)."""
    frozen = await _frozen_mid_chunk(start_worker, sandbox, writing=False, platform=platform)
    await _taken_over(start_worker, sandbox, frozen, env=FREEZE_ENV)
    sent = len(sandbox.state.deliveries)
    frozen.worker.thaw()
    await asyncio.sleep(3.0)  # what it would send goes out at once
    again = len(sandbox.state.deliveries) - sent
    assert again <= 1, f"{again} sent after the thaw:\n{frozen.worker.log_tail()}"
    _exited_as_frozen(frozen.worker)


async def test_a_worker_frozen_while_writing_holds_its_takeover_until_it_thaws_and_exits(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """SIGSTOP in the middle of a chunk, while the worker holds SQLite's write lock: the
    run is marked dead and another worker claims it, but records nothing (its writes
    wait for the lock) until SIGCONT. Then the frozen worker exits before it sends again,
    its lock goes with it, and the taker completes the request: nobody missing, at most
    the messages in flight at the freeze sent twice."""
    frozen = await _frozen_mid_chunk(start_worker, sandbox, writing=True)
    start_worker(**FREEZE_ENV)
    await _marked_dead(frozen.request_id)
    await asyncio.sleep(3.0)  # the taker's sweep (every 2 s) claims it; its writes wait
    assert _recorded(frozen.request_id) == (frozen.chunks, frozen.recorded)
    frozen.worker.thaw()
    _exited_as_frozen(frozen.worker)
    await _completed_once(sandbox, frozen)


async def _marked_dead(request_id: str, timeout: float = 120) -> None:
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


def _exited_as_frozen(worker: ManagedProcess) -> None:
    assert worker.popen.wait(timeout=10) == freeze.EXIT_CODE, worker.log_tail()
    assert "was frozen for" in worker.log_tail()


SHARE_CHUNK_SIZE = 2_500
SHARE_COUNT = KILL_USERS // SHARE_CHUNK_SIZE  # one chunk a share: 8
LIVE_SHARES = 2


async def _shares(request_id: str) -> list[FlowRun]:
    """The request's ``deliver-chunks`` runs, in chunk order."""
    async with get_client() as client:
        deployment = await prefect_runs.deployment_id(
            client, prefect_runs.CHUNKS_DEPLOYMENT_FULL_NAME
        )
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment]),
                tags=FlowRunFilterTags(all_=[f"request:{request_id}"]),
            )
        )
    return sorted(runs, key=lambda run: run.parameters["chunk_nos"])


async def test_a_worker_killed_before_every_share_is_made_resends_at_most_the_messages_in_flight(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """SIGKILL in the middle of a chunk of a request delivered through shares, while the
    shares beyond its window of live share runs are not made yet; a new worker takes over.

    The request's new run finds the share runs already made (those of the dead worker
    are taken over too) and delivers or offers the rest; counted as above.
    """
    env = {
        "CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY),
        "CT_CHUNKS_PER_RUN": "1",
        "CT_LIVE_SHARES": str(LIVE_SHARES),
    }
    # Kill four and a half chunks' worth of messages in (the request's run and a share
    # run send at once): the first shares are not made, nor all of them delivered.
    killed = await _killed_mid_chunk(
        start_worker, sandbox, env=env, chunk_size=SHARE_CHUNK_SIZE, kill_at=11_250
    )
    assert killed.recorded > killed.chunks * SHARE_CHUNK_SIZE  # a chunk under way
    made = await _shares(killed.request_id)  # as at the kill: no run makes shares now
    assert len(made) < SHARE_COUNT - 1, [s.parameters for s in made]
    # offered from the last share back; the first (chunk 0) is the request's run's own
    assert [s.parameters["chunk_nos"] for s in made] == [
        [k] for k in range(SHARE_COUNT - len(made), SHARE_COUNT)
    ]
    assert len(made) <= killed.chunks + LIVE_SHARES  # each made once an earlier one ended

    await _taken_over(start_worker, sandbox, killed, env=env)
    shares = await _shares(killed.request_id)
    # The share runs made before the kill were found again, none made twice, and none
    # of the first share: the request's run delivered it, and every chunk not in a share run.
    assert {s.id for s in made} <= {s.id for s in shares}
    chunk_nos = [s.parameters["chunk_nos"] for s in shares]
    assert len(chunk_nos) == len({c[0] for c in chunk_nos})
    assert [0] not in chunk_nos
    assert {state_name(s) for s in shares} == {"COMPLETED"}
    print(
        f"{len(made)} of {SHARE_COUNT - 1} share runs made at the kill, {len(shares)} in "
        f"all, {killed.chunks} chunks complete"
    )


async def _running_shares(request_id: str) -> set[int]:
    """The chunks of the request's shares that are Running (one chunk a share)."""
    return {
        s.parameters["chunk_nos"][0]
        for s in await _shares(request_id)
        if state_name(s) == "RUNNING"
    }


async def _claimed_ahead(request_id: str) -> bool:
    """Whether the request's run's last own chunk is under way, far from its end, and the
    share run of the last chunk runs already: claimed ahead, waiting for the only chunk
    slot. (Running is not enough on its own: the share may be claimed and not begun.)
    The chunks are read again after the shares, so no chunk ended meanwhile."""
    chunks, _ = _recorded(request_id)  # one slot: chunk ``chunks`` is being sent
    running = await _running_shares(request_id)
    again, recorded = _recorded(request_id)
    sent = recorded - chunks * SHARE_CHUNK_SIZE
    under_way = again == chunks == SHARE_COUNT - 2 and 0 < sent < SHARE_CHUNK_SIZE * 3 // 4
    return under_way and SHARE_COUNT - 1 in running


async def test_a_worker_killed_with_a_share_claimed_ahead_resends_at_most_the_messages_in_flight(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """SIGKILL mid-chunk while the share offered, claimed ahead of its turn (the request's
    run on its last own chunk hands its slot on), waits for the worker's only chunk slot;
    a new worker takes both over. Counted as above.

    The sandbox answers each message after 120 ms, so a chunk takes about 3 s: at full
    speed a chunk took 0.4 s on a fast machine, and the moment (the share Running, the
    chunk under way not 3/4 sent) lasted some 70 ms, less than the test needs to see
    it; at 60 ms, on a slow machine running two test files at once, the share took 1 s
    to start and the moment lasted 0.4 s, missed."""
    env = {
        "CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY),
        "CT_CHUNKS_PER_RUN": "1",
        "CT_LIVE_SHARES": "3",
    }
    options = ("--chunk-concurrency", "1")
    killed = await _killed_mid_chunk(
        start_worker,
        sandbox,
        env=env,
        options=options,
        chunk_size=SHARE_CHUNK_SIZE,
        kill_at=SHARE_CHUNK_SIZE + SHARE_CHUNK_SIZE // 4,
        until=_claimed_ahead,
        latency_ms=120,
    )
    assert killed.recorded > killed.chunks * SHARE_CHUNK_SIZE  # a chunk under way
    # the worker alone: the request's run sent every share but the one offered, which
    # runs, claimed ahead, not begun
    assert killed.chunks == SHARE_COUNT - 2, killed.chunks
    assert await _running_shares(killed.request_id) == {SHARE_COUNT - 1}

    await _taken_over(start_worker, sandbox, killed, env=env, options=options)
    shares = await _shares(killed.request_id)
    assert [s.parameters["chunk_nos"] for s in shares] == [[SHARE_COUNT - 1]]
    assert {state_name(s) for s in shares} == {"COMPLETED"}


async def test_a_request_accepted_while_prefect_is_down_is_delivered_once_it_is_back(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    deployed_server: ManagedProcess,
) -> None:
    start_worker()
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=5, prefix=f"down-{uuid.uuid4().hex[:6]}")
    add_devices(audience.devices)
    deployed_server.stop()
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
        notify_new_request(request_id)  # the service call succeeds: the request is in the outbox
        await asyncio.sleep(2)
    finally:
        deployed_server.popen = deployed_server._spawn()
        wait_http(
            deployed_server.env["PREFECT_API_URL"] + "/health", timeout=90, process=deployed_server
        )
    run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=90)
    assert state_name(run) == "COMPLETED", run.state
    assert set(sandbox.delivered([d.token for d in audience.devices if d.token]).values()) == {1}


class Partition:
    """A TCP relay to the Prefect server that can be cut, as a network partition cuts a
    link: from then on what either side sends is dropped, and a new connection is
    accepted and left unanswered. Connections and processes stay up. It relays on a
    thread of its own (the tests' loop waits for workers to start, blocking)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut = False
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> Partition:
        self._thread.start()
        assert self._ready.wait(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        # asyncio.run then cancels the relays left and waits for them

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            await self._pump(reader, None)
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        back = asyncio.create_task(self._pump(upstream_reader, writer))
        try:
            await self._pump(reader, upstream_writer)
        finally:
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await back

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None
    ) -> None:
        try:
            while data := await reader.read(65536):
                if writer is not None and not self.cut:
                    writer.write(data)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            if writer is not None and not self.cut:
                writer.close()


async def _dead_run_states(request_id: str) -> int:
    """How many times the request's run was marked dead."""
    run = await read_run(request_id)
    assert run is not None
    async with get_client() as client:
        states = await client.read_flow_run_states(run.id)
    return sum(1 for s in states if s.name == prefect_runs.DEAD_RUN_STATE_NAME)


@pytest.mark.parametrize("platform", [Platform.android, Platform.ios])
async def test_a_worker_cut_off_from_prefect_stops_before_its_run_is_taken_over_sending_none_twice(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    platform: Platform,
) -> None:
    """A worker that can reach the database and the provider but no longer Prefect (a
    network partition, the server down), in the middle of a chunk: its runs' heartbeats
    stop reaching the server, which marks the run dead and hands it to another worker.
    Unfenced, the cut-off worker went on with its chunk and the next ones beside the
    taker, both sending the same messages. Its lease (delivery/freeze.py) lapses first:
    it starts no new message, records the answers to those in flight, and exits before
    the run can be marked dead; the taker sends the rest, and nobody gets it twice. Over
    HTTP/1.1 to FCM and over HTTP/2 to APNs.

    The sandbox answers slowly from the cut on (``CUT_LATENCY_MS``), so that without the
    fence the worker would still be sending when the taker starts."""
    env = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}
    prefect_port = urlsplit(os.environ["PREFECT_API_URL"]).port
    assert prefect_port is not None
    with Partition(prefect_port) as partition:
        worker = start_worker(PREFECT_API_URL=partition.api_url, **env)
        before = len(sandbox.state.deliveries)
        request = _one_device_each(platform, prefix="cut", chunk_size=5000)
        request_id, tokens = request.request_id, request.tokens
        latency = sandbox.state.latency_ms
        deadline = time.monotonic() + 120
        while len(sandbox.state.deliveries) - before < 7_300:  # inside the second chunk
            assert time.monotonic() < deadline, worker.log_tail()
            await asyncio.sleep(0.002)
        sandbox.state.configure(latency_ms=CUT_LATENCY_MS)
        try:
            partition.cut = True
            cut_at = time.monotonic()
            exit_code = await asyncio.to_thread(worker.popen.wait, 60)
            lasted = time.monotonic() - cut_at
            assert exit_code == freeze.EXIT_CODE, worker.log_tail()
            print(f"cut off: exited {lasted:.1f} s after the cut")
            assert "has reached Prefect for" in worker.log_tail()
            # the lease lapsed before the run could be marked dead (40 s without a heartbeat)
            assert lasted < get_settings().dead_run_after_seconds, lasted
            assert await _dead_run_states(request_id) == 0
            await asyncio.sleep(CUT_LATENCY_MS / 1000 + 1)  # its last sends land
        finally:
            sandbox.state.configure(latency_ms=latency)
    cut_off = _as_it_stands(worker, sandbox, request)
    assert cut_off.recorded < KILL_USERS  # it stopped with messages left to send
    assert cut_off.in_flight == 0  # every message it sent has its answer recorded
    await _taken_over(start_worker, sandbox, cut_off, env=env)
    assert await _dead_run_states(request_id) == 1
    assert set(sandbox.delivered(tokens).values()) == {1}


async def test_a_run_that_outlasts_the_dead_run_limit_keeps_its_worker(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """The worker sends its runs' heartbeats itself (not Prefect's engine: ``heartbeats.py``):
    a request that takes longer than ``CT_DEAD_RUN_AFTER_SECONDS`` is never marked dead
    nor taken over, and each device gets its message once. The sandbox answers each
    message after 1 s, one at a time: ``dead_after + 5`` Android devices take that many
    seconds (the iOS device of each user would double it, testing nothing more)."""
    dead_after = get_settings().dead_run_after_seconds
    start_worker(CT_DELIVERY_CONCURRENCY="1")
    tenant = seed_tenant()
    audience = bulk_audience(tenant, users=dead_after + 5, prefix=f"long-{uuid.uuid4().hex[:6]}")
    audience.devices = [d for d in audience.devices if d.app_id == tenant.android]
    add_devices(audience.devices)
    latency = sandbox.state.latency_ms
    sandbox.state.configure(latency_ms=1000)
    try:
        request_id = add_request(tenant, audience.users, send_at=datetime.now(UTC))
        notify_new_request(request_id)
        run = await wait_for_state(request_id, "COMPLETED", "FAILED", "CRASHED", timeout=180)
    finally:
        sandbox.state.configure(latency_ms=latency)
    assert state_name(run) == "COMPLETED", run.state
    assert run.start_time is not None
    assert run.end_time is not None
    assert (run.end_time - run.start_time).total_seconds() > dead_after
    assert await _dead_run_states(request_id) == 0
    assert set(sandbox.delivered([d.token for d in audience.devices if d.token]).values()) == {1}
