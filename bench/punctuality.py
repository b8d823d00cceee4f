"""Punctuality benchmark: how late after ``send_at`` does delivery start?

Starts a private stack (``harness.private_stack``: a Prefect server on SQLite, a
temporary home; ``run_all.py``'s shared one in quick mode), the sandbox providers (a
thread), and one ``campaign-trigger worker`` process; creates 50
one-message requests scheduled ~20 s ahead (time to create their runs), staggered
every 0.3 s, plus 10 send-now requests; then prints, per kind, the p50 / p95 / max lag
and the earliest start, for

* ``flow start``: the flow run's start time in Prefect (Running) - ``send_at``;
* ``first send``: the provider's acceptance time (report ``sent_at``) - ``send_at``;

and the p50 / p95 of each stage of a send-now request (``STAGES``), from its run's
records.

The flow sleeps until ``send_at`` if it starts early, so ``first send`` is never
negative. Target (DESIGN §6): scheduled p95 <= 1 s, send-now <= 3 s.

Usage: ``.venv/bin/python bench/punctuality.py [--scheduled 50] [--now 10] [--lead 8]
[--platform android|ios]`` (iOS: the requests' devices are iPhones, sent through APNs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from harness import free_port, private_stack, result, stop_process

if TYPE_CHECKING:  # Prefect is imported once the private stack's settings are in place
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import TaskRun

TARGET_SCHEDULED = 1.0  # DESIGN §6: scheduled p95 <= 1 s after send_at
TARGET_NOW = 3.0  # send-now within 3 s
# A send-now request's path, each stage ending at: its run created in Prefect, claimed
# by the worker (Pending), started (Running), its task runs' starts and ends (``prepare
# delivery``; ``deliver chunk 1/1`` started), the message accepted by the provider.
STAGES = ("created", "claimed", "started", "to prepare", "prepare", "to chunk", "sent")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(name: str, lags: list[float]) -> str:
    return (
        f"{name:<22} n={len(lags):<3} p50 {statistics.median(lags):6.3f} s  "
        f"p95 {percentile(lags, 0.95):6.3f} s  max {max(lags):6.3f} s  "
        f"earliest {min(lags):+6.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduled", type=int, default=50)
    parser.add_argument("--now", type=int, default=10)
    parser.add_argument("--stagger", type=float, default=0.3)
    parser.add_argument(
        "--lead", type=float, default=8.0, help="s before the first send_at, + 0.3 s per run"
    )
    parser.add_argument(
        "--platform",
        choices=["android", "ios"],
        default="android",
        help="the devices' platform: FCM's path, or APNs' (the sandbox's HTTP/2)",
    )
    parser.add_argument("--profile", help="write a cProfile of the worker to this file")
    args = parser.parse_args()

    with private_stack() as home:
        sandbox_port = free_port()
        os.environ["CT_SANDBOX_PORT"] = str(sandbox_port)
        from campaign_trigger.config import get_settings
        from campaign_trigger.delivery.sandbox import running_sandbox

        get_settings.cache_clear()
        log = home / f"punctuality-worker-{sandbox_port}.log"
        worker: subprocess.Popen[bytes] | None = None
        try:
            with running_sandbox(port=sandbox_port):
                worker = subprocess.Popen(
                    [
                        sys.executable,
                        *(["-m", "cProfile", "-o", args.profile] if args.profile else []),
                        "-m",
                        "campaign_trigger.cli",
                        "worker",
                        "--concurrency",
                        "32",
                    ],
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                while b"ready: polling" not in log.read_bytes():
                    assert worker.poll() is None, log.read_text()
                    time.sleep(0.1)
                asyncio.run(
                    measure(args.scheduled, args.now, args.stagger, args.lead, args.platform)
                )
        finally:
            if worker is not None:
                stop_process(worker)


async def measure(scheduled: int, now: int, stagger: float, lead: float, platform: str) -> None:
    from prefect import get_client
    from sqlalchemy import insert, select

    from campaign_trigger.config import get_settings
    from campaign_trigger.services import scheduling
    from campaign_trigger.services.requests import create_request
    from campaign_trigger.services.trigger_input import TriggerInput
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.files import get_storage
    from campaign_trigger.store.models import (
        App,
        Campaign,
        CampaignApp,
        CampaignState,
        Channel,
        Device,
        Organisation,
        Outcome,
        Platform,
        Request,
    )

    with session_scope() as session:
        org = Organisation(name=f"bench-{uuid.uuid4().hex[:6]}")
        session.add(org)
        session.flush()
        assert org.id is not None
        app = App(
            app_id=f"bench-{org.id}",
            org_id=org.id,
            platform=Platform(platform),
            sdk_key=uuid.uuid4().hex,
        )
        campaign = Campaign(
            org_id=org.id,
            channel=Channel.push,
            state=CampaignState.started,
            title="Hi {{ name }}",
            body="Body",
            variables=["name"],
        )
        session.add_all([app, campaign])
        session.flush()
        session.add(CampaignApp(campaign_id=campaign.id, app_id=app.app_id))
        session.execute(
            insert(Device),
            [
                {
                    "app_id": app.app_id,
                    "device_id": f"d{i}",
                    "user_id": f"u{i}",
                    "push_token": f"tok-{i}",
                    "opted_in": True,
                    "logged_in": True,
                    "updated_at": datetime.now(UTC),
                }
                for i in range(scheduled + now)
            ],
        )
        org_id, campaign_id = org.id, campaign.id

    def _in_outbox(ids: list[str]) -> bool:
        with session_scope() as session:
            return (
                session.execute(
                    select(Request.id)
                    .where(Request.id.in_(ids))  # type: ignore[attr-defined]
                    .where(Request.flow_run_id.is_(None))  # type: ignore[union-attr]
                ).first()
                is not None
            )

    settings = get_settings()
    storage = get_storage(settings)

    def add(user: int, send_at: datetime) -> str:
        """A one-message request, through the service the API calls."""
        trigger = TriggerInput(
            campaign_id=campaign_id,
            send_at=send_at.isoformat(),
            messages=[{"user_id": f"u{user}", "template_variables": {"name": "x"}}],
        )
        with session_scope() as session:
            return create_request(
                session=session,
                settings=settings,
                storage=storage,
                org_id=org_id,
                request_id=uuid.uuid4().hex,
                trigger=trigger,
            )

    async def drain_outbox() -> int:
        with session_scope() as session:
            return await scheduling.drain_outbox(session=session)

    # A SQLite Prefect server creates ~5 runs/s: leave time to create them all first.
    base = datetime.now(UTC) + timedelta(seconds=lead + 0.3 * scheduled)
    kinds: dict[str, str] = {}
    for i in range(scheduled):
        kinds[add(i, base + timedelta(seconds=stagger * i))] = "scheduled"
    started = time.monotonic()
    while await drain_outbox() or _in_outbox(list(kinds)):
        await asyncio.sleep(0.2)
    print(
        f"created {scheduled} scheduled runs in {time.monotonic() - started:.1f} s; "
        f"first due in {(base - datetime.now(UTC)).total_seconds():.1f} s"
    )
    await asyncio.sleep(
        max(0.0, (base - datetime.now(UTC)).total_seconds()) + stagger * scheduled + 3
    )
    for i in range(now):
        kinds[add(scheduled + i, datetime.now(UTC))] = "send-now"
        await drain_outbox()  # what the API's drainer does when notified
        await asyncio.sleep(1.0)

    deadline = time.monotonic() + 120
    while True:
        with session_scope() as session:
            rows = session.execute(
                select(Request.id, Request.send_at, Request.flow_run_id, Outcome.sent_at)
                .join(Outcome, Outcome.request_id == Request.id)
                .where(Request.id.in_(list(kinds)))  # type: ignore[attr-defined]
            ).all()
        if len(rows) == len(kinds) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    flow_lag: dict[str, list[float]] = {"scheduled": [], "send-now": []}
    send_lag: dict[str, list[float]] = {"scheduled": [], "send-now": []}
    # Where a send-now request's time goes, from its records (``STAGES``).
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    async with get_client() as client:
        for request_id, send_at, flow_run_id, sent_at in rows:
            run = await client.read_flow_run(uuid.UUID(flow_run_id))
            kind = kinds[request_id]
            if run.start_time is not None:
                flow_lag[kind].append((run.start_time - send_at).total_seconds())
            if sent_at is not None:
                send_lag[kind].append((sent_at - send_at).total_seconds())
            if kind == "send-now" and sent_at is not None:
                states = await client.read_flow_run_states(run.id)
                claimed = min(s.timestamp for s in states if s.type.value == "PENDING")
                prepare, chunk = await _steps(client, run.id)
                moments = [
                    send_at,
                    run.created,
                    claimed,
                    run.start_time,
                    prepare.start_time,
                    prepare.end_time,
                    chunk.start_time,
                    sent_at,
                ]
                for stage, begin, end in zip(STAGES, moments[:-1], moments[1:], strict=True):
                    assert begin is not None
                    assert end is not None
                    stages[stage].append((end - begin).total_seconds())
    print(
        f"requests: {scheduled} scheduled (staggered {stagger} s), {now} send-now; "
        f"delivered {len(rows)}/{len(kinds)}"
    )
    for kind in ("scheduled", "send-now"):
        if send_lag[kind]:
            print(summary(f"{kind} flow start", flow_lag[kind]))
            print(summary(f"{kind} first send", send_lag[kind]))
    if stages["created"]:
        print(
            "send-now stages, p50 / p95: "
            + "; ".join(
                f"{stage} {statistics.median(lags):.3f} / {percentile(lags, 0.95):.3f} s"
                for stage, lags in stages.items()
            )
        )
    everything = len(rows) == len(kinds)
    for kind, limit, count in (
        ("scheduled", TARGET_SCHEDULED, scheduled),
        ("send-now", TARGET_NOW, now),
    ):
        if not send_lag[kind]:
            continue
        p95 = percentile(send_lag[kind], 0.95)
        early = min(send_lag[kind]) < 0
        result(
            "punctuality",
            f"{kind} first send after send_at, p95 of {count}"
            + (" (iOS)" if platform == "ios" else ""),
            figure=f"{p95:.3f} s (earliest {min(send_lag[kind]):+.3f} s)",
            reference=(
                f"{percentile(flow_lag[kind], 0.95):.3f} s "
                "(Prefect's flow-run start, p95 of the same runs)"
                if flow_lag[kind]
                else "none (no flow-run start read)"
            ),
            ratio=None,
            target=f"p95 <= {limit:.0f} s, never before send_at, every request delivered",
            met=p95 <= limit and not early and everything,
        )


async def _steps(client: PrefectClient, flow_run_id: uuid.UUID) -> tuple[TaskRun, TaskRun]:
    """The run's ``prepare delivery`` and ``deliver chunk`` task runs, once the server has
    recorded them from their events (about once a second: the run may have ended first)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 30
    while True:
        task_runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        prepare = [t for t in task_runs if t.name == "prepare delivery" and t.end_time]
        chunk = [t for t in task_runs if t.name.startswith("deliver chunk") and t.start_time]
        if prepare and chunk:
            return prepare[0], chunk[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {flow_run_id}: its steps not recorded within 30 s")
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    main()
