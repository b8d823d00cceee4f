"""The API under an open-loop load: creates of 100 JSON messages mixed with lists and cancels.

Starts a private stack (Prefect server on SQLite, one ``campaign-trigger worker``, the
sandbox providers), then ``campaign-trigger api --workers N`` and offers it a fixed
arrival rate (open loop: an operation every 1/R s whatever the answers do) of, in every
ten operations, eight creates of 100 JSON messages scheduled an hour ahead, one list of
the campaign's scheduled requests and one cancel of an earlier create. For each rate it
prints p50 and p99 of the creates' latency, errors, the API's CPU per create (all its
processes) and whether the rate held (p99 <= 250 ms, no error). The knee is the highest
rate that held. Afterwards every accepted create must be in the database: none lost.

The reference, measured in the same run at the same rates and process count: a bare
FastAPI application under the same uvicorn, one route that parses the same body into
pydantic models of the specification's shape and answers a request id — the floor any
Python API of this shape pays. Printed: our CPU per create against its CPU per call.

``--profile DIR`` samples the API processes with py-spy (``pip install py-spy``) during
the rate ``--profile-rate``. ``--postgres`` puts the service database (not the Prefect
server's) in a throwaway database on the local PostgreSQL server, to tell what SQLite's
single writer costs from the rest.

Usage: ``.venv/bin/python bench/api_creates.py [--rates 25 50 100] [--seconds 20]
[--workers 2] [--postgres]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness import (
    POSTGRES,
    Audience,
    Profile,
    free_port,
    knee_verdict,
    member_token,
    percentile,
    postgres_database,
    private_stack,
    result,
    seed_audience,
    start_process,
    stop_process,
    tree_cpu,
    wait_http,
)

TARGET_RATE = 100.0
TARGET_P99 = 0.250
TARGET_CPU = 0.010
MESSAGES = 100

REFERENCE_APP = """
import uuid
from typing import Any
from fastapi import FastAPI
from pydantic import BaseModel

class Message(BaseModel):
    user_id: str
    template_variables: dict[str, Any] | None = None

class Trigger(BaseModel):
    campaign_id: str
    send_at: str | None = None
    messages: list[Message]

app = FastAPI()

@app.post("/api/campaigns/trigger")
async def trigger(body: Trigger) -> dict[str, str]:
    return {"request_id": uuid.uuid4().hex}
"""


class Api:
    """An API (ours or the reference) as ``uvicorn --workers N`` child processes."""

    def __init__(self, home: Path, name: str, argv: list[str], port: int, ready: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.process = start_process(home, name, argv, CT_API_PORT=str(port))
        wait_http(f"{self.base}{ready}")

    def cpu(self) -> float:
        return tree_cpu(psutil.Process(self.process.pid))

    def processes(self) -> dict[str, psutil.Process]:
        root = psutil.Process(self.process.pid)
        children = root.children(recursive=True) or [root]
        return {f"api-{n}": p for n, p in enumerate(children)}

    def stop(self) -> None:
        stop_process(self.process)


class Load:
    """One rate's operations and what they answered."""

    def __init__(self) -> None:
        self.create_latencies: list[float] = []
        self.created: list[str] = []
        self.errors: dict[str, int] = {}

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def _body(campaign_id: str, users: list[str], n: int) -> dict[str, Any]:
    send_at = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "campaign_id": campaign_id,
        "send_at": send_at,
        "messages": [
            {
                "user_id": users[(n * MESSAGES + k) % len(users)],
                "template_variables": {"first_name": f"Ada{k}", "order_id": f"A-{n}-{k}"},
            }
            for k in range(MESSAGES)
        ],
    }


async def _offer(
    api: str, token: str, campaign_id: str, users: list[str], rate: float, seconds: float
) -> Load:
    load = Load()
    operations = int(rate * seconds / 0.8)  # eight creates in every ten operations
    bodies = [_body(campaign_id, users, n) for n in range(operations)]
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    headers = {"Authorization": f"Bearer {token}"}
    start = time.monotonic()
    async with httpx.AsyncClient(
        base_url=api, timeout=10, headers=headers, limits=limits
    ) as client:

        async def create(n: int) -> None:
            began = time.monotonic()
            answer = await client.post("/api/campaigns/trigger", json=bodies[n])
            if answer.status_code != 200:
                load.error(f"create {answer.status_code}")
                return
            load.create_latencies.append(time.monotonic() - began)
            load.created.append(answer.json()["request_id"])

        async def listing() -> None:
            answer = await client.get(f"/api/campaigns/{campaign_id}/request/scheduled")
            if answer.status_code != 200:
                load.error(f"list {answer.status_code}")

        async def cancel() -> None:
            if not load.created:
                return
            request_id = load.created.pop(0)
            answer = await client.put(f"/api/campaigns/request/{request_id}/cancel")
            if answer.status_code != 200:
                load.error(f"cancel {answer.status_code}")
                load.created.append(request_id)

        async def one(n: int) -> None:
            await asyncio.sleep(max(0.0, start + n / (rate / 0.8) - time.monotonic()))
            kind = n % 10
            try:
                await (listing() if kind == 4 else cancel() if kind == 9 else create(n))
            except httpx.HTTPError as exc:
                load.error(type(exc).__name__)

        await asyncio.gather(*(one(n) for n in range(operations)))
    return load


async def _offer_reference(
    api: str, campaign_id: str, users: list[str], rate: float, seconds: float
) -> Load:
    load = Load()
    calls = int(rate * seconds)
    bodies = [_body(campaign_id, users, n) for n in range(calls)]
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:

        async def one(n: int) -> None:
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
            began = time.monotonic()
            answer = await client.post("/api/campaigns/trigger", json=bodies[n])
            if answer.status_code != 200:
                load.error(f"create {answer.status_code}")
                return
            load.create_latencies.append(time.monotonic() - began)

        await asyncio.gather(*(one(n) for n in range(calls)))
    return load


def _line(label: str, rate: float, load: Load, cpu: float) -> tuple[str, bool]:
    latencies = load.create_latencies or [float("inf")]
    p99 = percentile(latencies, 0.99)
    held = not load.errors and p99 <= TARGET_P99
    errors = ", ".join(f"{k} x{v}" for k, v in load.errors.items()) or "none"
    return (
        f"  {label:<9} {rate:6.0f} creates/s: p50 {statistics.median(latencies) * 1000:6.0f} ms"
        f"  p99 {p99 * 1000:6.0f} ms  errors {errors}  CPU {cpu * 1000:5.1f} ms per create"
        f"  {'held' if held else 'NOT held'}",
        held,
    )


def _stored(request_ids: list[str]) -> int:
    from sqlmodel import col, func, select

    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Request

    with session_scope() as session:
        found = session.exec(select(func.count()).where(col(Request.id).in_(request_ids))).one()
    return int(found)


class Run:
    """What one process count measured: knee and CPU per create of ours and the reference."""

    def __init__(self) -> None:
        self.knee = {"ours": 0.0, "reference": 0.0}
        self.held: dict[str, dict[float, bool]] = {"ours": {}, "reference": {}}
        self.cpu: dict[str, list[float]] = {"ours": [], "reference": []}
        self.accepted: list[str] = []

    def record(self, label: str, rate: float, api: Api, before: float, load: Load) -> None:
        cpu = (api.cpu() - before) / max(1, len(load.create_latencies))
        self.cpu[label].append(cpu)
        line, held = _line(label, rate, load, cpu)
        print(line, flush=True)
        self.held[label][rate] = held
        if held:
            self.knee[label] = max(self.knee[label], rate)
        self.accepted += load.created if label == "ours" else []


def _measure_ours(
    args: argparse.Namespace, home: Path, audience: Audience, token: str, run: Run
) -> None:
    cli = [sys.executable, "-m", "campaign_trigger.cli"]
    port = free_port()
    ours = Api(home, "api", [*cli, "api", "--workers", str(args.workers)], port, "/health")
    try:
        for rate in args.rates:
            profile = None
            if args.profile and rate == args.profile_rate:
                profile = Profile(args.profile, ours.processes(), args.seconds)
            before = ours.cpu()
            load = asyncio.run(
                _offer(ours.base, token, audience.campaign_id, audience.users, rate, args.seconds)
            )
            run.record("ours", rate, ours, before, load)
            if profile is not None:
                profile.cpu_per_request(len(load.create_latencies))
    finally:
        ours.stop()


def _measure_reference(args: argparse.Namespace, home: Path, audience: Audience, run: Run) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-reference-api-"))
    (folder / "reference_api.py").write_text(REFERENCE_APP)
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(folder), "reference_api:app"]
    argv += ["--port", str(port), "--workers", str(args.workers), "--no-access-log"]
    reference = Api(home, "reference", [*argv, "--log-level", "warning"], port, "/docs")
    try:
        for rate in args.rates:
            before = reference.cpu()
            load = asyncio.run(
                _offer_reference(
                    reference.base, audience.campaign_id, audience.users, rate, args.seconds
                )
            )
            run.record("reference", rate, reference, before, load)
    finally:
        reference.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=float, nargs="+", default=[25.0, 50.0, 100.0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2, help="API processes")
    parser.add_argument("--profile", type=Path, help="py-spy the API into this folder")
    parser.add_argument("--profile-rate", type=float, default=50.0)
    parser.add_argument(
        "--postgres", action="store_true", help="the service database on the local PostgreSQL"
    )
    args = parser.parse_args()
    cli = [sys.executable, "-m", "campaign_trigger.cli"]
    with ExitStack() as stack:
        settings: dict[str, str] = {}
        if args.postgres:
            settings["CT_DATABASE_URL"] = f"{POSTGRES}/{stack.enter_context(postgres_database())}"
        home = stack.enter_context(private_stack(**settings))
        print(f"service database: {'PostgreSQL' if args.postgres else 'SQLite'}", flush=True)
        os.environ.update(
            {"CT_SANDBOX_PORT": str(free_port()), "CT_SANDBOX_TLS_PORT": str(free_port())}
        )
        from campaign_trigger.config import get_settings

        get_settings.cache_clear()
        audience = seed_audience(MESSAGES * 10)
        token = member_token(audience.org_id)
        others = [
            start_process(home, "sandbox", [*cli, "sandbox"]),
            start_process(home, "worker", [*cli, "worker"]),
        ]
        run = Run()
        try:
            _measure_ours(args, home, audience, token, run)
            _measure_reference(args, home, audience, run)
        finally:
            for process in others:
                stop_process(process)
        ours, reference = (statistics.median(run.cpu[k]) for k in ("ours", "reference"))
        knee, reference_knee = run.knee["ours"], run.knee["reference"]
        stored = _stored(run.accepted)
        print(f"accepted creates stored: {stored}/{len(run.accepted)}", flush=True)
        met = False if stored < len(run.accepted) else knee_verdict(run.held["ours"], TARGET_RATE)
        result(
            "api_creates",
            f"creates of {MESSAGES} messages, {args.workers} API process(es), highest rate held "
            f"of {', '.join(f'{rate:g}' for rate in args.rates)}/s",
            figure=f"{knee:.0f} creates/s",
            reference=f"{reference_knee:.0f} calls/s (bare FastAPI route, same uvicorn and rates)",
            ratio=knee / reference_knee if reference_knee else None,
            target=(
                f">= {TARGET_RATE:.0f}/s open loop, p99 <= {TARGET_P99 * 1000:.0f} ms, "
                "no error, none lost"
            ),
            met=met,
            why=(
                ""
                if met is not None
                else "undecided: no rate at or above the target held, none below it failed"
            ),
        )
        result(
            "api_creates",
            f"API CPU per create of {MESSAGES} messages, median of the rates",
            figure=f"{ours * 1000:.1f} ms",
            reference=f"{reference * 1000:.1f} ms (bare FastAPI route, CPU per call)",
            ratio=ours / reference,
            target=f"<= {TARGET_CPU * 1000:.0f} ms",
            met=ours <= TARGET_CPU,
        )


if __name__ == "__main__":
    main()
