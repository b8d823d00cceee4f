"""One-message "send now" requests through the whole stack: the sustained rate.

Starts a private stack (Prefect server on SQLite, the API, one `campaign-trigger
worker`, the sandbox providers, each its own process), then sends one-message JSON
creates through the HTTP API at fixed arrival rates (open loop: a request every 1/R s
whatever the answers do), each to its own user and device. For each rate it prints
how many were delivered and the latency from the API call to the provider's receipt
(the sandbox's ``received_at``): p50, p95, max. A rate is sustained when every request
was delivered and p95 <= 3 s (DESIGN §6: >= 5 requests/s).

The reference, measured on the same server in the same run: empty flow runs with the
same three task runs (prepare, chunk, report), bulk-created and executed the way the
worker executes ours (a race-free Pending claim, then ``run_flow_async``, 8 at a time,
one process): their rate, and the ratio of ours to it (target >= 1.5).

The worker logs at INFO (as ``campaign-trigger up`` does): its run logs reach the
Prefect server, as a user watching the UI sees them.

``--profile DIR`` samples the Prefect server, the worker and the API with py-spy
(``pip install py-spy``) during the rate ``--profile-rate`` and writes their collapsed
stacks (``DIR/<process>.txt``, one line per stack with its sample count) and the CPU
each process used per request.

``--decide`` measures the reference first, then runs the two rates that decide the
targets and no other: 5 /s, and exactly 1.5 times the reference's rate.
Judged from the rates tried, a run can leave the ratio undecided (every rate below 1.5x
held and the next one tried failed); a run with ``--decide`` cannot.

Usage: ``.venv/bin/python bench/request_rate.py [--rates 3 4 5 6 | --decide]
[--seconds 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness import (
    PREFECT_PID,
    Profile,
    knee_verdict,
    member_token,
    percentile,
    private_stack,
    result,
    seed_audience,
    start_send_now_stack,
    token_of,
)

TARGET_RATE = 5.0
JUDGED_SECONDS = 30.0  # a shorter phase (make bench's quick run) cannot show a rate held
TARGET_P95 = 3.0
TARGET_RATIO = 1.5


async def send_at_rate(
    api: str, token: str, campaign_id: str, users: list[str], rate: float
) -> dict[str, float]:
    """Create one request per user, one every 1/rate s; user -> when it was sent."""
    sent: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {token}"}
    start = time.monotonic()

    async with httpx.AsyncClient(base_url=api, timeout=60, headers=headers) as client:

        async def one(n: int, user: str) -> None:
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
            sent[user] = time.time()
            answer = await client.post(
                "/api/campaigns/trigger",
                json={
                    "campaign_id": campaign_id,
                    "messages": [
                        {
                            "user_id": user,
                            "template_variables": {"first_name": "A", "order_id": "1"},
                        }
                    ],
                },
            )
            answer.raise_for_status()

        await asyncio.gather(*(one(n, u) for n, u in enumerate(users)))
    return sent


def _latencies(sandbox: str, sent: dict[str, float], wait_seconds: float) -> list[float]:
    """Seconds from the API call to the provider's receipt, for each delivered user."""
    deadline = time.monotonic() + wait_seconds
    latencies: dict[str, float] = {}
    users = {token_of(user): user for user in sent}
    # One read of the sandbox's deliveries a sweep, on one kept connection: a
    # ``httpx.get`` per user (~26 ms of CPU each) took seconds of CPU a sweep from the
    # stack while the rate's last requests were still being delivered.
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline and len(latencies) < len(sent):
            for delivery in client.get(f"{sandbox}/sandbox/deliveries").json():
                user = users.get(delivery["token"])
                if user is not None and user not in latencies:
                    latencies[user] = float(delivery["received_at"]) - sent[user]
            time.sleep(0.5)
    return list(latencies.values())


def _settle(campaign_id: str, timeout: float = 300) -> None:
    """Wait until no request of this benchmark's campaign is still scheduled or running
    (then two seconds, for their runs' last states): a rate not sustained leaves runs
    behind its last delivery, and the next phase or the reference measured beside that
    backlog counted the server's work for both (the reference read ~4x its CPU per run).
    Only its own: in ``make bench``'s shared stack, a request an earlier benchmark claimed
    and left running (``chunk_overhead``'s reference) kept it waiting until it failed."""
    from sqlmodel import Session, col, func, select

    from campaign_trigger.store.db import get_engine
    from campaign_trigger.store.models import Request, RequestState

    unfinished = col(Request.state).in_((RequestState.scheduled, RequestState.running)) & (
        col(Request.campaign_id) == campaign_id
    )
    deadline = time.monotonic() + timeout
    with Session(get_engine()) as session:
        while session.exec(select(func.count()).select_from(Request).where(unfinished)).one():
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests still unfinished after {timeout:.0f} s")
            time.sleep(1)
            session.expire_all()
    time.sleep(2)


async def _reference(runs: int, server: psutil.Process) -> tuple[float, float]:
    """Empty flow runs with three task runs, executed as the worker executes ours.

    Their rate, and the Prefect server's CPU seconds per run (creation included).
    """
    from prefect import flow, get_client, task
    from prefect.flow_engine import run_flow_async
    from prefect.states import Pending, Scheduled

    @task
    async def step() -> None:
        return None

    @flow(name=f"bench-empty-{uuid.uuid4().hex[:6]}", persist_result=False)
    async def empty() -> None:
        await step()
        await step()
        await step()

    deployment_id = await (await empty.ato_deployment(name="bench")).aapply()
    cpu_before = sum(server.cpu_times()[:2])
    async with get_client() as client:
        created = [
            await client.create_flow_run_from_deployment(
                deployment_id, state=Scheduled(scheduled_time=datetime.now(UTC))
            )
            for _ in range(runs)
        ]
        gate = asyncio.Semaphore(8)

        async def execute(run: Any) -> None:
            async with gate:
                await client.set_flow_run_state(run.id, Pending(message="bench"))
                await run_flow_async(empty, flow_run=run, parameters={}, return_type="state")

        started = time.monotonic()
        await asyncio.gather(*(execute(r) for r in created))
        rate = runs / (time.monotonic() - started)
    return rate, (sum(server.cpu_times()[:2]) - cpu_before) / runs


def reference_of(runs: int, server: psutil.Process) -> tuple[float, float]:
    """The reference's rate and its server CPU a run (:func:`_reference`), printed."""
    reference, cpu = asyncio.run(_reference(runs, server))
    print(
        f"reference, empty flow runs with 3 task runs executed in-process: "
        f"{reference:.2f} runs/s, Prefect server CPU {cpu * 1000:.0f} ms per run",
        flush=True,
    )
    return reference, cpu


def deciding_rates(reference: float) -> list[float]:
    """The rates whose outcome decides both targets against ``reference`` (runs/s): the
    target rate and the target ratio's, each exactly (a rate held at or above a target
    meets it, one failed at or below it misses it: :func:`harness.knee_verdict`; a rate
    rounded up that failed would decide nothing)."""
    return sorted({TARGET_RATE, TARGET_RATIO * reference})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=float, nargs="+", default=[3.0, 4.0, 5.0, 6.0])
    parser.add_argument(
        "--decide",
        action="store_true",
        help="the reference first, then only the rates the targets name (5/s, 1.5x the reference)",
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--reference-runs", type=int, default=60)
    parser.add_argument(
        "--postgres", action="store_true", help="Prefect and the service on PostgreSQL"
    )
    parser.add_argument("--profile", type=Path, help="py-spy the processes into this folder")
    parser.add_argument("--profile-rate", type=float, default=5.0)
    args = parser.parse_args()
    with private_stack(postgres=args.postgres) as home:
        api, sandbox, processes = start_send_now_stack(home)
        try:
            server = psutil.Process(int(os.environ[PREFECT_PID]))
            measured = reference_of(args.reference_runs, server) if args.decide else None
            rates = args.rates if measured is None else deciding_rates(measured[0])
            total = int(sum(rate * args.seconds for rate in rates)) + 10
            audience = seed_audience(total)
            token = member_token(audience.org_id)
            users = iter(audience.users)
            sustained = 0.0
            held: dict[float, bool] = {}
            for rate in rates:
                _settle(audience.campaign_id)
                batch = [next(users) for _ in range(int(rate * args.seconds))]
                profile = None
                if args.profile and rate == args.profile_rate:
                    named = {
                        "server": server,
                        "api": processes[1],
                        "worker": processes[2],
                    }
                    profile = Profile(
                        args.profile,
                        {name: psutil.Process(p.pid) for name, p in named.items()},
                        args.seconds,
                    )
                sent = asyncio.run(send_at_rate(api, token, audience.campaign_id, batch, rate))
                latencies = _latencies(sandbox, sent, wait_seconds=60)
                p95 = percentile(latencies, 0.95) if latencies else float("inf")
                ok = len(latencies) == len(batch) and p95 <= TARGET_P95
                held[rate] = ok
                sustained = max(sustained, rate) if ok else sustained
                print(
                    f"{rate:5.2f} requests/s for {args.seconds:.0f} s: "
                    f"{len(latencies)}/{len(batch)} delivered; API -> provider "
                    f"p50 {statistics.median(latencies):.2f} s  p95 {p95:.2f} s  "
                    f"max {max(latencies):.2f} s  {'sustained' if ok else 'NOT sustained'}",
                    flush=True,
                )
                if profile is not None:
                    cpu = profile.cpu_per_request(len(batch))
                    print(
                        "  CPU per request: "
                        + ", ".join(
                            f"{name} {seconds * 1000:.0f} ms" for name, seconds in cpu.items()
                        )
                        + f" (py-spy stacks in {args.profile})",
                        flush=True,
                    )
            if measured is None:
                _settle(audience.campaign_id)
                measured = reference_of(args.reference_runs, server)
            reference = measured[0]
            verdicts = (
                knee_verdict(held, TARGET_RATE),
                knee_verdict(held, TARGET_RATIO * reference),
            )
            met = False if False in verdicts else None if None in verdicts else True
            why = (
                ""
                if met is not None
                else "undecided: no rate at or above a target held, none below it failed"
            )
            if args.seconds < JUDGED_SECONDS:  # a queue building up needs longer to show
                met = None
                why = f"quick: {args.seconds:g} s per rate, judged over {JUDGED_SECONDS:g} s"
            result(
                "request_rate",
                "one-message send-now requests, highest rate sustained of "
                + ", ".join(f"{rate:g}" for rate in rates)
                + "/s",
                figure=f"{sustained:.2f} requests/s",
                reference=f"{reference:.2f} runs/s (empty flow runs with 3 task runs, in-process)",
                ratio=sustained / reference,
                target=(
                    f">= {TARGET_RATE:.0f}/s with p95 API -> provider <= {TARGET_P95:.0f} s, "
                    f"and >= {TARGET_RATIO}x the reference"
                ),
                met=met,
                why=why,
            )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    main()
