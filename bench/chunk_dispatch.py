"""Chunk dispatch: what it costs to run a request's chunks on any worker process.

A request's flow run (``bench-request``, executed in-process by this script's driver
after a Scheduled -> Pending claim, as ``campaign-trigger worker`` does) runs
``--chunks`` chunks; a chunk sleeps ``--chunk-ms`` (the send time of 5,000 messages
against a fast responder) and returns a small dict. Candidates:

* ``inline``: today's model, ``await chunk_task(...)`` one after the other inside the
  request's flow run, one process (parallelism 1);
* ``tasks``: background tasks, ``chunk_task.delay(...)`` per chunk, awaited with
  ``result_async()``; 2 task-worker processes run ``prefect.task_worker.aserve``
  (``limit=--worker-concurrency``). Parameters and results go through a
  ``local-file-system`` block named by ``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK``
  and ``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK`` (each worker also gets its own
  ``PREFECT_RESULTS_LOCAL_STORAGE_PATH``, as if on another machine);
* ``subflows``: one flow run of ``deliver-chunk/default`` per chunk, created with
  ``arun_deployment(..., timeout=0)`` (a subflow of the request's run); 2 worker
  processes poll for Scheduled runs, claim them Scheduled -> Pending and execute them
  in-process with ``run_flow_async`` (``--worker-concurrency`` at a time); the
  request polls its children's states. Flow-run heartbeats are on (30 s).

Every cell (backend x round x candidate) gets a fresh Prefect server (and, for
PostgreSQL, a throwaway database), fresh workers and a driver process, which measures
the server's idle CPU, runs a warm-up request, the measured request (wall time, CPU of
every process: driver, workers, server, PostgreSQL backends; chunks per worker; pick-up
latency), then ``--probes`` chunks submitted one at a time to idle workers (start
latency). The ``inline`` cell also measures the reference: empty flow runs with 3 task
runs, claimed and executed in-process 8 at a time. Candidates are interleaved per round.

The summary gives, per backend and candidate, medians over the rounds: wall time,
orchestration overhead per chunk ((wall - chunks x chunk time / parallelism) / chunks),
CPU per chunk of the driver, the workers, the server and the PostgreSQL backends, chunk
pick-up latency inside the request (start - max(submit, the moment its worker had a free
slot)), start latency of a lone chunk (start - submit), the server's idle CPU, the
Prefect client's 503 retries ("database is locked" on SQLite) and the chunks each worker
process ran. Slices: ``--chunks 10 --chunk-ms 1200`` makes each unit 4 chunks long.

``--kill-tests [NAME ...]`` runs the failure experiments instead (SQLite):

* ``storage``: background tasks without the shared storage block (each process its own
  local storage): the worker cannot read the parameters;
* ``server-restart``: background task runs queued when the Prefect server restarts;
* ``tasks``: SIGKILL of a task worker mid-chunk, then the lost task runs re-enqueued
  (Scheduled, deferred, same parameters id), twice at once;
* ``tasks-duplicate``: a chunk a live worker is running, re-enqueued twice;
* ``subflows``: the server's answer to Pending claims from each state (and 2 concurrent
  Crashed -> Pending claims, 20 times), then SIGKILL of a flow worker mid-chunk: Prefect's
  "crash zombie flows" automation (missed heartbeats, ``--zombie-within`` s) marks the run
  Crashed, the other worker claims it Crashed -> Pending and runs it;
* ``subflows-pause``: the same with SIGSTOP, SIGCONT once the chunk was recovered.

Usage::

    .venv/bin/python bench/chunk_dispatch.py                       # SQLite, 3 rounds
    .venv/bin/python bench/chunk_dispatch.py --backends sqlite postgres --out /tmp/cd.json
    .venv/bin/python bench/chunk_dispatch.py --kill-tests            # all, ~8 min
    .venv/bin/python bench/chunk_dispatch.py --kill-tests subflows tasks

PostgreSQL: ``--pg-dsn`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``, trust
auth); a database ``bench_<hex>`` is created per cell and dropped afterwards.
``BENCH_KEEP=1`` keeps each cell's directory (server, driver and worker logs, chunk log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from harness import free_port, result, tree_cpu, wait_http

SCRIPT = Path(__file__).resolve()
BIN = Path(sys.executable).parent
CANDIDATES = ("inline", "tasks", "subflows")
KILL_TESTS = (
    "storage",
    "server-restart",
    "tasks",
    "tasks-duplicate",
    "subflows",
    "subflows-pause",
)
CHUNK_LOG = "BENCH_CHUNK_LOG"
STORAGE_BLOCK = "local-file-system/bench-chunk-storage"
CHUNK_DEPLOYMENT = "deliver-chunk/default"
TARGET_MS = 15.0  # 5 % of a 300 ms chunk
VERDICT_CHUNKS = 40  # fewer chunks: the request's fixed costs weigh on each
SUBMITS: dict[str, dict[int, float]] = {}  # request -> chunk -> submit time (driver)
RECOVERY: dict[str, Any] = {}  # what a request flow saw while recovering (kill tests)
MARKS: dict[str, dict[str, float]] = {}  # request -> flow body begin / all submitted / done


# -- the chunk (every process) ------------------------------------------------------


def log_event(**fields: Any) -> None:
    """Append one JSON line to the cell's chunk log (O_APPEND: atomic across processes)."""
    path = os.environ.get(CHUNK_LOG)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


async def send_chunk(request: str, chunk_no: int, ms: int) -> dict[str, Any]:
    """A chunk: ~``ms`` of sending, simulated."""
    started = time.time()
    log_event(ev="start", request=request, chunk=chunk_no, pid=os.getpid(), t=started)
    await asyncio.sleep(ms / 1000)
    log_event(ev="end", request=request, chunk=chunk_no, pid=os.getpid(), t=time.time())
    return {"request": request, "chunk": chunk_no, "pid": os.getpid(), "sent": 5000}


async def deliver_chunk(request: str, chunk_no: int, ms: int) -> dict[str, Any]:
    """The body of the ``deliver-chunk`` flow (candidate ``subflows``)."""
    return await send_chunk(request, chunk_no, ms)


async def noop(n: int) -> int:
    return n


async def bench_empty() -> None:
    """The reference flow: 3 awaited task runs, nothing else."""
    for n in range(3):
        await defs().noop_task(n)


async def bench_request(
    mode: str,
    request: str,
    chunks: int,
    ms: int,
    sequential: bool = False,
    recover_after: float = 0.0,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """A request: its chunks, dispatched the ``mode`` way."""
    submits = SUBMITS.setdefault(request, {})
    marks = MARKS.setdefault(request, {})
    marks["begin"] = time.time()
    if mode == "inline":
        for n in range(chunks):
            submits[n] = time.time()
            await defs().chunk_task(request, n, ms)
        result = {"chunks": chunks}
    elif mode == "tasks":
        result = await _background_tasks(request, chunks, ms, sequential, recover_after, timeout)
    elif mode == "subflows":
        result = await _child_flow_runs(request, chunks, ms, sequential, recover_after, timeout)
    else:
        raise ValueError(mode)
    marks["done"] = time.time()
    return result


@functools.cache
def defs() -> SimpleNamespace:
    """Prefect objects, built on first use (the orchestrator never imports Prefect)."""
    from prefect import flow, task

    return SimpleNamespace(
        chunk_task=task(name="deliver-chunk")(send_chunk),
        chunk_flow=flow(name="deliver-chunk")(deliver_chunk),
        request_flow=flow(name="bench-request")(bench_request),
        noop_task=task(name="noop")(noop),
        empty_flow=flow(name="bench-empty")(bench_empty),
        race_flow=flow(name="race-chunk")(deliver_chunk),
    )


# -- candidate tasks: background task runs -----------------------------------------


async def _background_tasks(
    request: str, chunks: int, ms: int, sequential: bool, recover_after: float, timeout: float
) -> dict[str, Any]:
    submits = SUBMITS[request]
    futures = []
    for n in range(chunks):
        submits[n] = time.time()
        future = defs().chunk_task.delay(request, n, ms)
        futures.append(future)
        if sequential:
            await _result(future, timeout)
    MARKS[request]["submitted"] = time.time()
    waiters = [asyncio.ensure_future(_result(f, timeout)) for f in futures]
    if recover_after:
        _, pending = await asyncio.wait(waiters, timeout=recover_after)
        ids = [f.task_run_id for f, w in zip(futures, waiters, strict=True) if w in pending]
        RECOVERY["after_wait"] = await _task_run_states([f.task_run_id for f in futures])
        # two recoverers at the same instant (say the request and a sweeper): both succeed?
        first, second = await asyncio.gather(_requeue_task_runs(ids), _requeue_task_runs(ids))
        RECOVERY["requeued"] = first + second
        RECOVERY["requeued_at"] = time.time()
    results = await asyncio.gather(*waiters)
    if recover_after:
        RECOVERY["final"] = await _task_run_states([f.task_run_id for f in futures])
        RECOVERY["done_at"] = time.time()
    return {"chunks": len(results)}


async def _result(future: Any, timeout: float) -> Any:
    """``future.result_async()``, retried while Prefect reads the task run without a state
    (``RuntimeError: Task run ... has no state``, seen intermittently on SQLite)."""
    while True:
        try:
            return await future.result_async(timeout=timeout)
        except RuntimeError as exc:
            if "has no state" not in str(exc):
                raise
            log_event(ev="no-state", pid=os.getpid(), t=time.time())
            await asyncio.sleep(0.1)


async def _task_run_states(ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)), limit=len(ids)
        )
    order = {run_id: n for n, run_id in enumerate(ids)}
    return sorted(
        (
            {
                "id": str(run.id),
                "chunk": order[run.id],
                "state": run.state.name if run.state else None,
                "flow_run_id": str(run.flow_run_id),
                "run_count": run.run_count,
            }
            for run in runs
        ),
        key=lambda row: row["chunk"],
    )


async def _requeue_task_runs(ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    """Scheduled (deferred, same parameters) again: the server re-enqueues them."""
    from prefect import get_client
    from prefect.states import Scheduled

    answers = []
    async with get_client() as client:
        for run_id in ids:
            history = await client.read_task_run_states(run_id)
            params = next(
                s.state_details.task_parameters_id
                for s in history
                if s.state_details.task_parameters_id
            )
            state = Scheduled(message="re-enqueued by the request (worker lost)")
            state.state_details.deferred = True
            state.state_details.task_parameters_id = params
            result = await client.set_task_run_state(run_id, state)
            answers.append({"id": str(run_id), "answer": result.status.value})
    return answers


# -- candidate subflows: child flow runs of deliver-chunk -----------------------------


async def _child_flow_runs(
    request: str, chunks: int, ms: int, sequential: bool, recover_after: float, timeout: float
) -> dict[str, Any]:
    from prefect import get_client
    from prefect.deployments import arun_deployment

    submits = SUBMITS[request]
    ids: list[uuid.UUID] = []
    async with get_client() as client:
        for n in range(chunks):
            submits[n] = time.time()
            run = await arun_deployment(
                CHUNK_DEPLOYMENT,
                parameters={"request": request, "chunk_no": n, "ms": ms},
                flow_run_name=f"{request}-{n}",
                timeout=0,
                client=client,
            )
            ids.append(run.id)
            if sequential:
                await _wait_flow_runs(client, [run.id], timeout, crashed_is_final=True)
        MARKS[request]["submitted"] = time.time()
        states = await _wait_flow_runs(client, ids, timeout, crashed_is_final=not recover_after)
    bad = {str(k): v for k, v in states.items() if v != "COMPLETED"}
    if bad:
        raise RuntimeError(f"chunks not completed: {bad}")
    return {"chunks": len(ids)}


async def _wait_flow_runs(
    client: Any, ids: list[uuid.UUID], timeout: float, *, crashed_is_final: bool
) -> dict[uuid.UUID, str]:
    """Poll the runs (one call per 0.2 s for all of them) until final."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    final: dict[uuid.UUID, str] = {}
    seen: dict[str, dict[str, float]] = RECOVERY.setdefault("seen", {})
    deadline = time.monotonic() + timeout
    while len(final) < len(ids) and time.monotonic() < deadline:
        todo = [i for i in ids if i not in final]
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=todo)), limit=len(todo)
        )
        for run in runs:
            if run.state is None:
                continue
            kind = run.state.type.value
            seen.setdefault(str(run.id), {}).setdefault(kind, time.time())
            if kind == "COMPLETED" or (
                run.state.is_final() and (crashed_is_final or kind != "CRASHED")
            ):
                final[run.id] = kind
        if len(final) < len(ids):
            await asyncio.sleep(0.2)
    return final


# -- worker processes ---------------------------------------------------------------


def share_ssl_contexts() -> None:
    """As ``campaign_trigger.deployments.worker.share_prefect_ssl_contexts`` (the product
    worker does it): Prefect clients share one SSL context instead of loading the CA
    bundle per client (~50 ms of CPU each)."""
    import prefect.client.orchestration as orchestration

    class SharedSSL:
        def __init__(self) -> None:
            self.contexts: dict[Any, ssl.SSLContext] = {}

        def create_default_context(self, *args: Any, **kwargs: Any) -> ssl.SSLContext:
            key = (args, tuple(sorted(kwargs.items())))
            if key not in self.contexts:
                self.contexts[key] = ssl.create_default_context(*args, **kwargs)
            return self.contexts[key]

        def __getattr__(self, name: str) -> Any:
            return getattr(ssl, name)

    vars(orchestration)["ssl"] = SharedSSL()


class RetryCounter(logging.Handler):
    """Logs the Prefect client's retries (503 "database is locked", ...) as chunk-log events;
    passes its warnings on to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "retryable" in message:
            log_event(ev="retry", pid=os.getpid(), t=time.time(), message=message[:160])
        elif record.levelno >= logging.WARNING:
            print(f"prefect.client: {message}", file=sys.stderr)


def prepare_process() -> None:
    share_ssl_contexts()
    # importing prefect.main configures Prefect's logging (level of prefect.client
    # included): first that, then ours on top
    from prefect import get_client  # noqa: F401

    client_logger = logging.getLogger("prefect.client")
    client_logger.setLevel(logging.DEBUG)
    client_logger.propagate = False
    client_logger.addHandler(RetryCounter())


def role_task_worker(limit: int, ready: Path) -> None:
    prepare_process()
    from prefect.task_worker import aserve

    ready.touch()
    asyncio.run(aserve(defs().chunk_task, limit=limit))


def role_flow_worker(concurrency: int, ready: Path, poll: float, recover: bool) -> None:
    prepare_process()
    asyncio.run(_flow_worker(concurrency, ready, poll, recover))


async def _flow_worker(concurrency: int, ready: Path, poll: float, recover: bool) -> None:
    """Poll deliver-chunk runs, claim Scheduled (and Crashed, with ``recover``) ->
    Pending, run the claimed ones in-process, ``concurrency`` at a time."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound
    from prefect.flow_engine import run_flow_async
    from prefect.states import Pending

    active: dict[uuid.UUID, asyncio.Task[Any]] = {}
    freed = asyncio.Event()
    kinds = [StateType.SCHEDULED, *([StateType.CRASHED] if recover else [])]

    async def execute(run: Any) -> None:
        try:
            await run_flow_async(
                defs().chunk_flow, flow_run=run, parameters=run.parameters, return_type="state"
            )
        finally:
            active.pop(run.id, None)
            freed.set()

    async with get_client() as client:
        while True:
            try:
                deployment = await client.read_deployment_by_name(CHUNK_DEPLOYMENT)
                break
            except ObjectNotFound:
                await asyncio.sleep(0.5)
        ready.touch()
        wanted = FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=kinds)),
        )
        while True:
            free = concurrency - len(active)
            if free > 0:
                runs = await client.read_flow_runs(
                    flow_run_filter=wanted, sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=free + 2
                )
                for run in runs:
                    if len(active) >= concurrency:
                        break
                    was = run.state.type.value if run.state else None
                    answer = await client.set_flow_run_state(
                        run.id, Pending(message=f"bench worker {os.getpid()}")
                    )
                    accepted = answer.status.value == "ACCEPT"
                    log_event(ev="claim", pid=os.getpid(), run=str(run.id), was=was, ok=accepted)
                    if accepted:
                        if was != "SCHEDULED":  # a recovered run: start from its new state
                            run = await client.read_flow_run(run.id)
                        active[run.id] = asyncio.create_task(execute(run))
            freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), timeout=poll)


# -- the driver (one per cell) --------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its descendants (0 if gone)."""
    try:
        return tree_cpu(psutil.Process(pid))
    except psutil.Error:
        return 0.0


def postgres_cpu(database: str | None) -> dict[int, float]:
    """CPU per PostgreSQL backend serving ``database`` (empty without PostgreSQL)."""
    if not database:
        return {}
    backends = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith("postgres:") and f" {database} " in cmdline:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                backends[proc.pid] = times.user + times.system
    return backends


@dataclass
class CpuMeter:
    """CPU of every process of a cell between two snapshots. PostgreSQL backends are
    counted per backend pid (a backend that exits in between loses its share)."""

    pids: dict[str, int]
    database: str | None

    def snapshot(self) -> dict[str, Any]:
        values: dict[str, Any] = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        values["postgres"] = postgres_cpu(self.database)
        return values

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        out = {k: round(after[k] - before[k], 4) for k in before if k != "postgres"}
        old, new = before["postgres"], after["postgres"]
        out["postgres"] = round(sum(v - old.get(pid, 0.0) for pid, v in new.items()), 4)
        return out


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pickup_latencies(
    events: list[dict[str, Any]], request: str, submits: dict[int, float], capacity: int
) -> list[float]:
    """Per chunk: start - max(submit, the last instant its process had no free slot)."""
    starts = {e["chunk"]: e for e in events if e["ev"] == "start" and e["request"] == request}
    ends = {e["chunk"]: e["t"] for e in events if e["ev"] == "end" and e["request"] == request}
    latencies = []
    for chunk, start in starts.items():
        marks: list[tuple[float, int]] = []
        for other, o_start in starts.items():
            if other == chunk or o_start["pid"] != start["pid"] or o_start["t"] >= start["t"]:
                continue
            marks.append((o_start["t"], 1))
            if ends.get(other, float("inf")) <= start["t"]:
                marks.append((ends[other], -1))
        running, full_until = 0, float("-inf")
        for at, step in sorted(marks):
            if step < 0 and running >= capacity:
                full_until = at
            running += step
        latencies.append(start["t"] - max(submits[chunk], full_until))
    return latencies


def timeline(events: list[dict[str, Any]], request: str) -> dict[str, Any]:
    """The request's marks and each chunk's submit/start/end, in s after the run's creation."""
    zero = MARKS[request]["create"]
    chunks: dict[int, list[float]] = {n: [round(t - zero, 3)] for n, t in SUBMITS[request].items()}
    for event in events:
        if event["ev"] in ("start", "end") and event["request"] == request:
            chunks[event["chunk"]].append(round(event["t"] - zero, 3))
    marks = {k: round(v - zero, 3) for k, v in MARKS[request].items()}
    return {"marks": marks, "chunks": chunks}


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p95": p95, "n": len(ordered)}


async def ensure_deployment(client: Any, flow_obj: Any, name: str = "default") -> uuid.UUID:
    flow_id = await client.create_flow(flow_obj)
    return await client.create_deployment(
        flow_id=flow_id, name=name, entrypoint=f"{SCRIPT}:{flow_obj.fn.__name__}"
    )


async def run_request(client: Any, deployment_id: uuid.UUID, **parameters: Any) -> dict[str, Any]:
    """Create a request's run, claim it Scheduled -> Pending, run it in-process."""
    from prefect.flow_engine import run_flow_async
    from prefect.states import Pending, Scheduled

    started = time.time()
    MARKS[parameters["request"]] = {"create": started}
    run = await client.create_flow_run_from_deployment(
        deployment_id, parameters=parameters, state=Scheduled(), name=parameters["request"]
    )
    answer = await client.set_flow_run_state(run.id, Pending(message="bench driver"))
    assert answer.status.value == "ACCEPT", answer
    state = await run_flow_async(
        defs().request_flow, flow_run=run, parameters=run.parameters, return_type="state"
    )
    MARKS[parameters["request"]]["returned"] = time.time()
    return {"wall": time.time() - started, "state": state.type.value, "flow_run_id": run.id}


async def children_of(client: Any, flow_run_id: uuid.UUID) -> dict[str, Any]:
    """What the UI has under the request's run: its task runs and subflow runs."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    tasks = await client.read_task_runs(
        task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id])),
        limit=200,
    )
    subflows = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
        ),
        limit=200,
    )
    task_states: dict[str, int] = {}
    for run in tasks:
        key = f"{run.name.rsplit('-', 1)[0]}:{run.state.name if run.state else None}"
        task_states[key] = task_states.get(key, 0) + 1
    return {"task_runs": task_states, "subflow_runs": len(subflows)}


async def drive(config: dict[str, Any]) -> dict[str, Any]:
    from prefect import get_client

    mode = config["candidate"]
    log = Path(config["chunk_log"])
    out: dict[str, Any] = {"candidate": mode, "pids": config["pids"]}
    meter = CpuMeter(fix_driver_pid(config["pids"]), config.get("database"))
    async with get_client() as client:
        request_dep = await ensure_deployment(client, defs().request_flow)
        if mode == "subflows":
            await ensure_deployment(client, defs().chunk_flow)
        if mode == "tasks":
            from prefect.filesystems import LocalFileSystem

            await LocalFileSystem(basepath=config["shared_storage"]).save(
                STORAGE_BLOCK.split("/")[1], overwrite=True
            )
        await wait_ready(config)
        if config.get("automation"):
            out["automation"] = await create_zombie_automation(config["automation_within"])
        if config.get("transitions"):
            out["transitions"] = await claim_transitions(client)
        if config.get("kill_mode"):
            out["kill"] = await kill_request(client, request_dep, config)
            out["events"] = read_events(log)
            return out

        # idle: what the server (and the workers) burn with nothing to do
        before = meter.snapshot()
        await asyncio.sleep(config["idle_seconds"])
        out["idle_cpu_per_s"] = {
            k: round(v / config["idle_seconds"], 4)
            for k, v in CpuMeter.delta(before, meter.snapshot()).items()
        }
        params = {"mode": mode, "ms": config["chunk_ms"], "timeout": 600.0}
        warm = await run_request(client, request_dep, request="warm-up", chunks=4, **params)
        assert warm["state"] == "COMPLETED", warm

        out["load_before"] = os.getloadavg()
        before = meter.snapshot()
        measured = await run_request(
            client, request_dep, request="measured", chunks=config["chunks"], **params
        )
        cpu = CpuMeter.delta(before, meter.snapshot())
        out["load_after"] = os.getloadavg()
        assert measured["state"] == "COMPLETED", measured
        out["wall"] = measured["wall"]
        out["cpu"] = cpu
        out["ui"] = await children_of(client, measured["flow_run_id"])
        events = read_events(log)
        starts = [e for e in events if e["ev"] == "start" and e["request"] == "measured"]
        per_pid: dict[str, int] = {}
        for event in starts:
            per_pid[str(event["pid"])] = per_pid.get(str(event["pid"]), 0) + 1
        out["chunks_per_pid"] = per_pid
        out["claims"] = [e for e in events if e["ev"] == "claim"]
        out["no_state"] = sum(e["ev"] == "no-state" for e in events)
        out["retries"] = [
            e for e in events if e["ev"] == "retry" and e["t"] >= MARKS["measured"]["create"]
        ]
        out["timeline"] = timeline(events, "measured")
        out["pickup"] = pickup_latencies(
            events, "measured", SUBMITS["measured"], config["capacity"]
        )

        probe = await run_request(
            client,
            request_dep,
            request="probe",
            chunks=config["probes"],
            sequential=True,
            **params,
        )
        assert probe["state"] == "COMPLETED", probe
        events = read_events(log)
        out["start_latency"] = [
            e["t"] - SUBMITS["probe"][e["chunk"]]
            for e in events
            if e["ev"] == "start" and e["request"] == "probe"
        ]
        if config.get("reference"):
            out["reference"] = await reference_runs(client, meter, config["reference"])
    return out


async def wait_ready(config: dict[str, Any], timeout: float = 120) -> None:
    """Workers started, and (task workers) subscribed on the server."""
    from prefect import get_client

    deadline = time.monotonic() + timeout
    ready = [Path(p) for p in config.get("ready_files", [])]
    while not all(p.exists() for p in ready):
        if time.monotonic() > deadline:
            raise TimeoutError("workers not ready")
        await asyncio.sleep(0.2)
    if config["candidate"] == "tasks":
        async with get_client() as client:
            while True:
                response = await client._client.post("/task_workers/filter", json={})
                if len(response.json()) >= len(ready):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"task workers not subscribed: {response.json()}")
                await asyncio.sleep(0.2)


async def reference_runs(client: Any, meter: CpuMeter, count: int) -> dict[str, Any]:
    """Empty flow runs with 3 task runs: bulk-created Scheduled, claimed, run 8 at a time."""
    from prefect.flow_engine import run_flow_async
    from prefect.states import Pending, Scheduled

    dep = await ensure_deployment(client, defs().empty_flow)
    body = [
        {"state": Scheduled().model_dump(mode="json", include={"type", "name"}), "parameters": {}}
        for _ in range(count)
    ]
    response = await client._client.post(f"/deployments/{dep}/create_flow_run/bulk", json=body)
    ids = [r["flow_run_id"] for r in response.json()["results"]]
    runs = [await client.read_flow_run(uuid.UUID(i)) for i in ids]
    limiter = asyncio.Semaphore(8)

    async def one(run: Any) -> str:
        async with limiter:
            answer = await client.set_flow_run_state(run.id, Pending(message="bench reference"))
            assert answer.status.value == "ACCEPT"
            state = await run_flow_async(
                defs().empty_flow, flow_run=run, parameters={}, return_type="state"
            )
            return str(state.type.value)

    before = meter.snapshot()
    started = time.monotonic()
    states = await asyncio.gather(*(one(r) for r in runs))
    wall = time.monotonic() - started
    cpu = CpuMeter.delta(before, meter.snapshot())
    return {
        "runs": count,
        "states": sorted(set(states)),
        "runs_per_s": count / wall,
        "client_cpu_ms": cpu["driver"] / count * 1000,
        "server_cpu_ms": (cpu["server"] + cpu["postgres"]) / count * 1000,
    }


# -- kill tests (in the driver) -------------------------------------------------------


async def create_zombie_automation(within: float) -> str:
    """Prefect's documented "crash zombie flows" automation (missed heartbeats)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    automation = await Automation(
        name="crash-zombie-chunks",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED, message="Flow run marked as crashed (no heartbeat)"
            )
        ],
    ).acreate()
    return str(automation.id)


async def persisted_completed(client: Any, deployment_id: uuid.UUID) -> uuid.UUID:
    """A run of the chunk flow executed in-process with ``persist_result=True``."""
    from prefect.flow_engine import run_flow_async
    from prefect.states import Pending, Scheduled

    parameters = {"request": "race", "chunk_no": 0, "ms": 0}
    run = await client.create_flow_run_from_deployment(
        deployment_id, parameters=parameters, state=Scheduled()
    )
    await client.set_flow_run_state(run.id, Pending())
    state = await run_flow_async(
        defs().race_flow.with_options(persist_result=True),
        flow_run=run,
        parameters=parameters,
        return_type="state",
    )
    assert state.type.value == "COMPLETED", state
    return run.id


async def claim_transitions(client: Any) -> dict[str, Any]:
    """The server's answer to a Pending claim from each state, and concurrent claims."""
    from prefect import get_client
    from prefect.states import Cancelled, Completed, Crashed, Pending, Running, Scheduled

    dep = await ensure_deployment(client, defs().race_flow)

    async def fresh(*forced: Any) -> uuid.UUID:
        run = await client.create_flow_run_from_deployment(
            dep, parameters={"request": "race", "chunk_no": 0, "ms": 0}, state=Scheduled()
        )
        for state in forced:
            await client.set_flow_run_state(run.id, state, force=True)
        return run.id

    async def propose(run_id: uuid.UUID, state: Any) -> str:
        return str((await client.set_flow_run_state(run_id, state)).status.value)

    table = {
        "Scheduled -> Pending": await propose(await fresh(), Pending()),
        "Pending -> Pending (default name)": await propose(await fresh(Pending()), Pending()),
        "Pending -> Pending named 'Claimed'": await propose(
            await fresh(Pending()), Pending(name="Claimed")
        ),
        "Running -> Pending": await propose(await fresh(Pending(), Running()), Pending()),
        "Crashed -> Pending": await propose(
            await fresh(Pending(), Running(), Crashed()), Pending()
        ),
        "Crashed -> Scheduled": await propose(
            await fresh(Pending(), Running(), Crashed()), Scheduled()
        ),
        "Completed (no persisted result) -> Pending": await propose(
            await fresh(Pending(), Running(), Completed()), Pending()
        ),
        "Cancelled -> Pending": await propose(await fresh(Cancelled()), Pending()),
        "Running -> Crashed": await propose(await fresh(Pending(), Running()), Crashed()),
        "Completed -> Crashed": await propose(
            await fresh(Pending(), Running(), Completed()), Crashed()
        ),
        "Completed (persisted result) -> Pending": await propose(
            await persisted_completed(client, dep), Pending()
        ),
    }
    # concurrent claims of the same Crashed run from two clients, 20 runs
    races = []
    async with get_client() as other:
        for _ in range(20):
            run_id = await fresh(Pending(), Running(), Crashed())
            answers = await asyncio.gather(
                client.set_flow_run_state(run_id, Pending(message="claimer A")),
                other.set_flow_run_state(run_id, Pending(message="claimer B")),
            )
            races.append(sum(a.status.value == "ACCEPT" for a in answers))
    return {"table": table, "crashed_races_accepted_counts": races}


async def kill_request(client: Any, request_dep: uuid.UUID, config: dict[str, Any]) -> dict:
    started = time.time()
    if config.get("duplicate_only"):
        result = {"wall": 0.0, "state": None, "flow_run_id": None}
    else:
        result = await run_request(
            client,
            request_dep,
            mode=config["candidate"],
            request="kill",
            chunks=config["chunks"],
            ms=config["chunk_ms"],
            recover_after=config.get("recover_after", 0.0),
            timeout=config.get("request_timeout", 300.0),
        )
    recovery = dict(RECOVERY)
    duplicate = []
    for attempt in range(config.get("duplicate_check", 0)):  # re-enqueue a running chunk
        RECOVERY.clear()
        dup = await run_request(
            client,
            request_dep,
            mode="tasks",
            request=f"duplicate-{attempt}",
            chunks=1,
            ms=3000,
            recover_after=1.0,
            timeout=120.0,
        )
        answers = [a["answer"] for a in RECOVERY.get("requeued", [])]
        duplicate.append({"state": dup["state"], "answers": answers})
    if config.get("resumed_file"):  # the paused worker comes back: what does it do?
        while not Path(config["resumed_file"]).exists():
            await asyncio.sleep(0.5)
        await asyncio.sleep(config["chunk_ms"] / 1000 + 8)
        RECOVERY["histories"] = {}
        for run_id in RECOVERY.get("seen", {}):  # the polls may miss a short Crashed
            history = await client.read_flow_run_states(uuid.UUID(run_id))
            if any(s.type.value == "CRASHED" for s in history):
                RECOVERY["histories"][run_id] = [
                    (s.type.value, s.name, s.timestamp.timestamp(), s.message) for s in history
                ]
    return {
        "started": started,
        "wall": result["wall"],
        "state": result["state"],
        "recovery": recovery if config.get("duplicate_check") else RECOVERY,
        "submits": SUBMITS.get("kill", {}),
        "ui": await children_of(client, result["flow_run_id"]) if result["flow_run_id"] else {},
        "flow_run_id": str(result["flow_run_id"]),
        "duplicate": duplicate,
    }


async def storage_probe(config: dict[str, Any]) -> dict[str, Any]:
    """Background tasks with per-machine scheduling storage: submit 2, wait, look."""
    from prefect import flow, get_client

    await wait_ready(config)

    @flow(name="storage-probe")
    async def probe() -> list[str]:
        futures = [defs().chunk_task.delay("storage", n, 100) for n in range(2)]
        waiters = [asyncio.ensure_future(f.wait_async()) for f in futures]
        done, _ = await asyncio.wait(waiters, timeout=config["wait"])
        outcomes.extend(
            repr(w.exception())[:120] if w in done else "still waiting" for w in waiters
        )
        return [str(f.task_run_id) for f in futures]

    outcomes: list[str] = []
    ids = await probe()
    async with get_client() as client:
        rows = []
        for run_id in ids:
            try:
                run = await client.read_task_run(uuid.UUID(run_id))
                rows.append({"id": run_id, "state": run.state.name if run.state else None})
            except Exception as exc:
                rows.append({"id": run_id, "state": f"unreadable: {type(exc).__name__}"})
    return {"task_runs": rows, "parent_waits": outcomes, "waited_s": config["wait"]}


def submit_outside_flow(config: dict[str, Any]) -> dict[str, Any]:
    """``chunk_task.delay()`` outside any flow run (allowed for background tasks)."""
    from prefect.filesystems import LocalFileSystem

    LocalFileSystem(basepath=config["shared_storage"]).save(
        STORAGE_BLOCK.split("/")[1], overwrite=True
    )
    futures = [defs().chunk_task.delay(config["request"], n, 100) for n in range(config["count"])]
    return {"ids": [str(f.task_run_id) for f in futures]}


async def states_after(config: dict[str, Any]) -> dict[str, Any]:
    await wait_ready(config)
    await asyncio.sleep(config["wait"])
    rows = await _task_run_states([uuid.UUID(i) for i in config["ids"]])
    return {"states": [row["state"] for row in rows]}


def role_driver(config_path: Path) -> None:
    prepare_process()
    config = json.loads(config_path.read_text())
    if config.get("count"):
        result = submit_outside_flow(config)
    elif config.get("ids"):
        result = asyncio.run(states_after(config))
    elif config.get("storage_probe"):
        result = asyncio.run(storage_probe(config))
    else:
        result = asyncio.run(drive(config))
    Path(config["result"]).write_text(json.dumps(result, default=str))


# -- the orchestrator -----------------------------------------------------------------


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


@contextlib.contextmanager
def pg_database(dsn: str) -> Iterator[str]:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Server:
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    home: Path
    database: str | None

    def start(self) -> None:
        """Start (or start again: same port, same database) the server process."""
        port = self.env["PREFECT_API_URL"].rsplit(":", 1)[1].split("/", 1)[0]
        self.process = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
            stdout=(self.home / "server.log").open("ab"),
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        wait_http(f"http://127.0.0.1:{port}/api/health", timeout=180)


@contextlib.contextmanager
def prefect_server(backend: str, pg_dsn: str, **settings: str) -> Iterator[Server]:
    """A fresh Prefect server (SQLite file, or a throwaway PostgreSQL database)."""
    home = Path(tempfile.mkdtemp(prefix="chunk-dispatch-"))
    with contextlib.ExitStack() as stack:
        if not os.environ.get("BENCH_KEEP"):
            stack.callback(shutil.rmtree, home, True)
        database = None
        if backend == "postgres":
            database = stack.enter_context(pg_database(pg_dsn))
            host = pg_dsn.split("@", 1)[1].split("/", 1)[0]
            user = pg_dsn.split("//", 1)[1].split("@", 1)[0]
            url = f"postgresql+asyncpg://{user}@{host}/{database}"
        else:
            url = f"sqlite+aiosqlite:///{home / 'prefect.db'}"
        port = free_port()
        env = {
            **os.environ,
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_API_DATABASE_CONNECTION_URL": url,
            CHUNK_LOG: str(home / "chunks.jsonl"),
            **settings,
        }
        server = Server(env=env, process=None, home=home, database=database)  # type: ignore[arg-type]
        stack.callback(lambda: server.process and _stop(server.process))
        server.start()
        yield server


def start_worker(
    server: Server, role: str, ready: Path, extra: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = (server.home / f"{ready.stem}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--role", role, "--ready", str(ready), *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**server.env, **(env or {})},
        start_new_session=True,
    )


def worker_env(server: Server, candidate: str, n: int) -> dict[str, str]:
    if candidate == "tasks":  # another machine: its own local storage, the shared block
        return {
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(server.home / f"machine-{n}"),
            "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK": STORAGE_BLOCK,
            "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": STORAGE_BLOCK,
        }
    if candidate == "subflows":
        return {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    return {}


@contextlib.contextmanager
def workers(
    server: Server, candidate: str, concurrency: int, *, recover: bool = False
) -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        if candidate in ("tasks", "subflows"):
            for n in range(2):
                ready = server.home / f"worker-{n}.ready"
                if candidate == "tasks":
                    extra = ["--limit", str(concurrency)]
                    role = "task-worker"
                else:
                    extra = ["--limit", str(concurrency), *(["--recover"] if recover else [])]
                    role = "flow-worker"
                env = worker_env(server, candidate, n)
                started.append((start_worker(server, role, ready, extra, env), ready))
        yield started
    finally:
        for process, _ in started:
            _stop(process)


def driver_env(server: Server, candidate: str) -> dict[str, str]:
    env = dict(server.env)
    if candidate == "tasks":
        env["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(server.home / "machine-driver")
        env["PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK"] = STORAGE_BLOCK
        env["PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK"] = STORAGE_BLOCK
    return env


def run_driver(
    server: Server, config: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    path = server.home / f"driver-{uuid.uuid4().hex[:6]}.json"
    config = {**config, "result": str(path.with_suffix(".out.json"))}
    path.write_text(json.dumps(config))
    log = (server.home / "driver.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--role", "driver", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env or server.env,
        start_new_session=True,
    )
    process.result_path = Path(config["result"])  # type: ignore[attr-defined]
    return process


def driver_result(server: Server, process: subprocess.Popen[bytes], timeout: float) -> Any:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
    path: Path = process.result_path  # type: ignore[attr-defined]
    if process.returncode != 0 or not path.exists():
        tail = (server.home / "driver.log").read_text()[-4000:]
        raise RuntimeError(f"driver failed ({process.returncode}):\n{tail}")
    return json.loads(path.read_text())


def run_cell(args: argparse.Namespace, backend: str, candidate: str, rnd: int) -> dict[str, Any]:
    with (
        prefect_server(backend, args.pg_dsn) as server,
        workers(server, candidate, args.worker_concurrency) as procs,
    ):
        pids = {"driver": 0, "server": server.process.pid}
        for n, (process, _) in enumerate(procs):
            pids[f"worker{n}"] = process.pid
        config = {
            "candidate": candidate,
            "chunk_log": server.env[CHUNK_LOG],
            "shared_storage": str(server.home / "shared-storage"),
            "database": server.database,
            "ready_files": [str(r) for _, r in procs],
            "chunks": args.chunks,
            "chunk_ms": args.chunk_ms,
            "probes": args.probes,
            "idle_seconds": args.idle_seconds,
            "capacity": 1 if candidate == "inline" else args.worker_concurrency,
            "reference": args.reference if candidate == "inline" else 0,
        }
        # the driver's own pid is only known once started: it measures itself as "driver"
        process = run_driver(server, {**config, "pids": pids}, driver_env(server, candidate))
        result = driver_result(server, process, timeout=900)
    parallelism = 1 if candidate == "inline" else 2 * args.worker_concurrency
    ideal = args.chunks * args.chunk_ms / 1000 / parallelism
    result.update(
        backend=backend,
        round=rnd,
        parallelism=parallelism,
        ideal=ideal,
        overhead_ms=(result["wall"] - ideal) / args.chunks * 1000,
    )
    return result


def fix_driver_pid(pids: dict[str, int]) -> dict[str, int]:
    return {k: (os.getpid() if k == "driver" else v) for k, v in pids.items()}


def summarize(results: list[dict[str, Any]], chunks: int, chunk_ms: int) -> None:
    print("\n== medians per backend and candidate (per chunk; CPU in ms per chunk) ==")
    header = (
        f"{'backend':8} {'candidate':9} {'P':>2} {'wall s':>7} {'ovh ms':>7} "
        f"{'driver':>7} {'workers':>8} {'server':>7} {'pg':>6} {'total':>7} "
        f"{'pickup p50/p95 ms':>18} {'start p50/p95 ms':>17} {'idle srv %':>10} "
        f"{'503s':>4}  chunks/worker"
    )
    print(header)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["backend"], r["candidate"]), []).append(r)
    for (backend, candidate), rows in groups.items():

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else float("nan")

        def per_chunk(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return med(
                [
                    sum(v for k, v in r["cpu"].items() if k.startswith(key)) / chunks * 1000
                    for r in rows
                ]
            )

        total = med([sum(r["cpu"].values()) / chunks * 1000 for r in rows])
        pickup = quantiles([x for r in rows for x in r["pickup"]])
        start = quantiles([x for r in rows for x in r["start_latency"]])
        idle = med([r["idle_cpu_per_s"]["server"] * 100 for r in rows])
        spread = ["/".join(str(v) for v in r["chunks_per_pid"].values()) for r in rows]
        print(
            f"{backend:8} {candidate:9} {rows[0]['parallelism']:>2} "
            f"{med([r['wall'] for r in rows]):7.2f} {med([r['overhead_ms'] for r in rows]):7.1f} "
            f"{per_chunk('driver'):7.1f} {per_chunk('worker'):8.1f} {per_chunk('server'):7.1f} "
            f"{per_chunk('postgres'):6.1f} {total:7.1f} "
            f"{pickup['p50'] * 1000:8.0f}/{pickup['p95'] * 1000:<9.0f} "
            f"{start['p50'] * 1000:7.0f}/{start['p95'] * 1000:<9.0f} {idle:10.1f} "
            f"{med([len(r['retries']) for r in rows]):4.0f}  "
            f"{' '.join(spread)}"
        )
    for (backend, candidate), rows in groups.items():
        overhead = statistics.median(r["overhead_ms"] for r in rows)
        wall, ideal = statistics.median(r["wall"] for r in rows), rows[0]["ideal"]
        decided = chunks >= VERDICT_CHUNKS
        result(
            "chunk_dispatch",
            f"{candidate} on {backend}, {chunks} chunks of {chunk_ms} ms, "
            f"orchestration overhead per chunk, median of {len(rows)}",
            figure=f"{overhead:.0f} ms per chunk (wall {wall:.2f} s)",
            reference=(
                f"{ideal:.2f} s (chunks x chunk time / parallelism {rows[0]['parallelism']})"
            ),
            ratio=wall / ideal,
            target=f"overhead <= {TARGET_MS:.0f} ms per chunk",
            met=overhead <= TARGET_MS if decided else None,
            why="" if decided else f"quick size: judged on {VERDICT_CHUNKS} chunks",
        )
    refs = [r["reference"] for r in results if r.get("reference")]
    for r in results:
        if r.get("reference"):
            ref = r["reference"]
            print(
                f"reference ({r['backend']}, round {r['round']}): empty flow + 3 tasks, "
                f"8 at a time: {ref['runs_per_s']:.2f} runs/s, client CPU "
                f"{ref['client_cpu_ms']:.0f} ms/run, server CPU {ref['server_cpu_ms']:.0f} ms/run"
            )
    if not refs:
        print("(no reference runs)")
    print(f"target: orchestration overhead <= {TARGET_MS:.0f} ms per chunk (5 % of 300 ms)")


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for rnd in range(args.rounds):
        for backend in args.backends:
            shift = rnd % len(args.candidates)
            for candidate in args.candidates[shift:] + args.candidates[:shift]:
                load = os.getloadavg()
                result = run_cell(args, backend, candidate, rnd)
                result["load_cell_start"] = load
                results.append(result)
                cpu_total = sum(result["cpu"].values()) / args.chunks * 1000
                print(
                    f"round {rnd} {backend:8} {candidate:9} wall {result['wall']:6.2f} s "
                    f"(ideal {result['ideal']:.1f}) "
                    f"overhead {result['overhead_ms']:6.1f} ms/chunk, "
                    f"CPU {cpu_total:6.1f} ms/chunk {result['cpu']}, per worker "
                    f"{result['chunks_per_pid']}, 503 retries {len(result['retries'])}, "
                    f"load {load[0]:.2f}",
                    flush=True,
                )
    summarize(results, args.chunks, args.chunk_ms)
    return results


# -- kill tests (orchestrator side) ---------------------------------------------------


def wait_for_start(log: Path, pid: int, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in read_events(log):
            if event["ev"] == "start" and event["pid"] == pid:
                return event
        time.sleep(0.1)
    raise TimeoutError(f"worker {pid} started no chunk")


def kill_tasks(args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL a task worker mid-chunk (limit 2), then re-enqueue the lost task runs (twice,
    concurrently: two recoverers)."""
    with (
        prefect_server("sqlite", args.pg_dsn) as server,
        workers(server, "tasks", 2) as procs,
    ):
        log = Path(server.env[CHUNK_LOG])
        victim, survivor = procs[0][0], procs[1][0]
        config = {
            "candidate": "tasks",
            "chunk_log": str(log),
            "shared_storage": str(server.home / "shared-storage"),
            "ready_files": [str(r) for _, r in procs],
            "pids": {"server": server.process.pid},
            "kill_mode": True,
            "chunks": 8,
            "chunk_ms": 5000,
            "recover_after": 35.0,
            "request_timeout": 120.0,
        }
        driver = run_driver(server, config, driver_env(server, "tasks"))
        start = wait_for_start(log, victim.pid)
        time.sleep(1.0)
        killed_at = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        result = driver_result(server, driver, timeout=300)
    result.update(victim=victim.pid, survivor=survivor.pid, killed_at=killed_at, killed_chunk=start)
    return result


def duplicate_tasks(args: argparse.Namespace) -> dict[str, Any]:
    """2 live task workers (limit 2); a running chunk is re-enqueued twice, concurrently
    (a recoverer that wrongly took a slow worker for a dead one)."""
    with (
        prefect_server("sqlite", args.pg_dsn) as server,
        workers(server, "tasks", 2) as procs,
    ):
        config = {
            "candidate": "tasks",
            "chunk_log": server.env[CHUNK_LOG],
            "shared_storage": str(server.home / "shared-storage"),
            "ready_files": [str(r) for _, r in procs],
            "pids": {"server": server.process.pid},
            "kill_mode": True,
            "duplicate_only": True,
            "duplicate_check": 3,
        }
        result = driver_result(server, run_driver(server, config, driver_env(server, "tasks")), 300)
        time.sleep(3)  # late copies
        result["events"] = read_events(Path(server.env[CHUNK_LOG]))
    return result


def server_restart_test(args: argparse.Namespace) -> dict[str, Any]:
    """Background task runs waiting for a worker when the server restarts: 3 submitted
    before the restart, 3 after, then 2 task workers start."""
    with prefect_server("sqlite", args.pg_dsn) as server:
        env = driver_env(server, "tasks")
        common = {"candidate": "tasks", "shared_storage": str(server.home / "shared-storage")}
        before = driver_result(
            server, run_driver(server, {**common, "count": 3, "request": "before"}, env), 120
        )
        _stop(server.process)
        server.start()
        after = driver_result(
            server, run_driver(server, {**common, "count": 3, "request": "after"}, env), 120
        )
        with workers(server, "tasks", 2) as procs:
            config = {
                **common,
                "ids": before["ids"] + after["ids"],
                "wait": 20.0,
                "ready_files": [str(r) for _, r in procs],
            }
            states = driver_result(server, run_driver(server, config, env), 180)
    return {"before": states["states"][:3], "after": states["states"][3:]}


def storage_test(args: argparse.Namespace) -> dict[str, Any]:
    """Background tasks without the shared block: each process has its own local storage."""
    with prefect_server("sqlite", args.pg_dsn) as server:
        env = {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(server.home / "machine-w")}
        ready = server.home / "worker-0.ready"
        worker = start_worker(server, "task-worker", ready, ["--limit", "1"], env)
        try:
            config = {
                "candidate": "tasks",
                "storage_probe": True,
                "ready_files": [str(ready)],
                "wait": 20.0,
            }
            driver_env_ = {
                **server.env,
                "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(server.home / "machine-d"),
            }
            result = driver_result(server, run_driver(server, config, driver_env_), 180)
        finally:
            _stop(worker)
        worker_log = (server.home / "worker-0.log").read_text().splitlines()
    result["worker_errors"] = [
        line[:240] for line in worker_log if "ERROR" in line or line.startswith("ValueError")
    ][:6]
    return result


def kill_subflows(args: argparse.Namespace, *, pause: bool = False) -> dict[str, Any]:
    """SIGKILL a flow worker mid-chunk; the zombie automation marks the run Crashed; the
    other worker claims it Crashed -> Pending and runs it. With ``pause``: SIGSTOP instead,
    SIGCONT once the chunk was recovered (a frozen, not dead, worker)."""
    with (
        prefect_server("sqlite", args.pg_dsn) as server,
        workers(server, "subflows", 1, recover=True) as procs,
    ):
        log = Path(server.env[CHUNK_LOG])
        victim, survivor = procs[0][0], procs[1][0]
        resumed = server.home / "resumed"
        config = {
            "candidate": "subflows",
            "chunk_log": str(log),
            "ready_files": [str(r) for _, r in procs],
            "pids": {"server": server.process.pid},
            "kill_mode": True,
            "automation": True,
            "automation_within": args.zombie_within,
            "transitions": not pause,
            "chunks": 6,
            "chunk_ms": 5000,
            "recover_after": 1.0,  # a Crashed chunk is not final: wait for its recovery
            "request_timeout": 300.0,
            **({"resumed_file": str(resumed)} if pause else {}),
        }
        driver = run_driver(server, config)
        start = wait_for_start(log, victim.pid, timeout=180)
        time.sleep(1.0)
        killed_at = time.time()
        os.kill(victim.pid, signal.SIGSTOP if pause else signal.SIGKILL)
        if pause:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                events = read_events(log)
                if any(
                    e["ev"] == "end" and e["pid"] == survivor.pid and e["chunk"] == start["chunk"]
                    for e in events
                ):
                    break
                time.sleep(0.5)
            os.kill(victim.pid, signal.SIGCONT)
            resumed.touch()
        else:
            victim.wait(timeout=10)
        result = driver_result(server, driver, timeout=420)
    result.update(victim=victim.pid, survivor=survivor.pid, killed_at=killed_at, killed_chunk=start)
    return result


def report_kill_tasks(result: dict[str, Any]) -> None:
    kill = result["kill"]
    recovery = kill["recovery"]
    killed_at = result["killed_at"]
    print("\n== background tasks: SIGKILL of a task worker (limit 2) mid-chunk ==")
    print(f"killed pid {result['victim']} while running chunk {result['killed_chunk']['chunk']}")
    print("task runs 35 s after submission (survivor finished everything it could):")
    for row in recovery.get("after_wait", []):
        print(f"  chunk {row['chunk']}: {row['state']} (run_count {row['run_count']})")
    answers = [a["answer"] for a in recovery.get("requeued", [])]
    print(f"re-enqueued twice concurrently (Scheduled, deferred, same parameters id): {answers}")
    ends = {}
    for event in result["events"]:
        if event["ev"] == "end" and event["request"] == "kill":
            ends.setdefault(event["chunk"], []).append(event)
    for chunk, events in sorted(ends.items()):
        who = ", ".join(f"pid {e['pid']} at +{e['t'] - killed_at:.1f} s" for e in events)
        print(f"  chunk {chunk} completed by {who}")
    print(f"final: {[(r['chunk'], r['state']) for r in recovery.get('final', [])]}")
    print(f"request {kill['state']} after {kill['wall']:.1f} s; UI: {kill['ui']}")


def report_duplicate(result: dict[str, Any]) -> None:
    print("\n== background tasks: re-enqueueing (twice) a chunk a live worker is running ==")
    for attempt, dup in enumerate(result["kill"]["duplicate"]):
        runs = [
            e["pid"]
            for e in result["events"]
            if e["request"] == f"duplicate-{attempt}" and e["ev"] == "start"
        ]
        print(
            f"attempt {attempt}: answers {dup['answers']}, executions {len(runs)} "
            f"(pids {runs}); request {dup['state']}"
        )


def report_kill_subflows(result: dict[str, Any], *, pause: bool = False) -> None:
    kill = result["kill"]
    killed_at = result["killed_at"]
    if "transitions" in result:
        print("\n== transitions: the server's answer to each proposal ==")
        for name, answer in result["transitions"]["table"].items():
            print(f"  {name:45} {answer}")
        races = result["transitions"]["crashed_races_accepted_counts"]
        print(f"  2 concurrent Crashed -> Pending claims, accepted per run (20 runs): {races}")
    how = "SIGSTOP (resumed after the recovery)" if pause else "SIGKILL"
    print(f"\n== child flow runs: {how} of a flow worker mid-chunk ==")
    print(f"pid {result['victim']} stopped while running chunk {result['killed_chunk']['chunk']}")
    for run_id, seen in kill["recovery"].get("seen", {}).items():
        steps = ", ".join(f"{k} at +{t - killed_at:.1f} s" for k, t in sorted(seen.items()))
        if "CRASHED" in seen:
            print(f"  run {run_id}: {steps}")
    claims = [e for e in result["events"] if e["ev"] == "claim" and e.get("was") != "SCHEDULED"]
    for claim in claims:
        print(f"  recovery claim by pid {claim['pid']}: from {claim['was']}, ok={claim['ok']}")
    ends = [e for e in result["events"] if e["ev"] == "end" and e["request"] == "kill"]
    for event in sorted(ends, key=lambda e: e["t"]):
        at = event["t"] - killed_at
        print(f"  chunk {event['chunk']} ended by pid {event['pid']} at +{at:.1f} s")
    for run_id, history in kill["recovery"].get("histories", {}).items():
        print(f"  state history of {run_id} after the frozen worker resumed:")
        for kind, name, at, message in history:
            print(f"    +{at - killed_at:6.1f} s {kind:9} {name:10} {message or ''}")
    print(f"request {kill['state']} after {kill['wall']:.1f} s; UI: {kill['ui']}")


def kill_tests(args: argparse.Namespace) -> dict[str, Any]:
    chosen = args.kill_tests or KILL_TESTS
    out: dict[str, Any] = {}
    if "storage" in chosen:
        out["storage"] = storage_test(args)
        print("\n== background tasks without a shared scheduling storage block ==")
        print(f"task runs after {out['storage']['waited_s']} s: {out['storage']['task_runs']}")
        print(f"the parent's waits: {out['storage']['parent_waits']}")
        print("\n".join(out["storage"]["worker_errors"]))
    if "server-restart" in chosen:
        out["server_restart"] = server_restart_test(args)
        print("\n== background tasks queued when the Prefect server restarts ==")
        restart = out["server_restart"]
        print(f"3 submitted before the restart, 20 s after workers started: {restart['before']}")
        print(f"3 submitted after the restart: {restart['after']}")
    if "tasks" in chosen:
        out["tasks"] = kill_tasks(args)
        report_kill_tasks(out["tasks"])
    if "tasks-duplicate" in chosen:
        out["tasks_duplicate"] = duplicate_tasks(args)
        report_duplicate(out["tasks_duplicate"])
    if "subflows" in chosen:
        out["subflows"] = kill_subflows(args)
        report_kill_subflows(out["subflows"])
    if "subflows-pause" in chosen:
        out["subflows_pause"] = kill_subflows(args, pause=True)
        report_kill_subflows(out["subflows_pause"], pause=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite"], choices=["sqlite", "postgres"])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--chunk-ms", type=int, default=300)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--reference", type=int, default=24, help="empty runs (0: skip)")
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--kill-tests",
        nargs="*",
        choices=KILL_TESTS,
        help="run these failure experiments instead (none named: all)",
    )
    parser.add_argument("--zombie-within", type=float, default=45.0)
    parser.add_argument("--out", type=Path, help="write every measurement as JSON here")
    # internal: the child processes
    parser.add_argument("--role", choices=["driver", "task-worker", "flow-worker"])
    parser.add_argument("--config", type=Path)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--recover", action="store_true")
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    if args.role == "driver":
        role_driver(args.config)
        return
    if args.role == "task-worker":
        role_task_worker(args.limit, args.ready)
        return
    if args.role == "flow-worker":
        role_flow_worker(args.limit, args.ready, args.poll, args.recover)
        return
    print(f"host {socket.gethostname()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    started = time.monotonic()
    data = kill_tests(args) if args.kill_tests is not None else bench(args)
    print(f"done in {time.monotonic() - started:.0f} s; load {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps(data, default=str, indent=1))


if __name__ == "__main__":
    main()
