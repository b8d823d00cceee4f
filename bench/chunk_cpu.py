"""The worker's CPU per message on the chunk path, on fixed data, without Prefect.

What ``bench/million.py`` measures end to end, minus Prefect and the other processes: a
send-now CSV request of ``--users`` users (one Android device each, FCM answered by a
bare nginx; with ``--ios`` one iOS device each, APNs over TLS + h2 answered by nginx as
``bench/million.py --ios`` configures it) is claimed here and its chunks are delivered
by ``process_chunk`` as the ``deliver chunk`` task does (read the chunk, audience,
render, send, record), in ``--lanes`` concurrent lanes (a worker runs two shares at a
time by default), then its report files are written as ``assemble report`` does. This
process's CPU time (all its threads; nginx is another process) is printed per message
for each phase, so a cut's figure before → after is the same data and ignores the
machine's load. A warm-up request of one chunk goes first (imports, connections), after
the garbage collector is set up as the worker sets it (``settle_collector``).

``--postgres`` uses a throwaway database on the local PostgreSQL server (its server's
CPU is not counted); ``--reports DIR`` copies the report files there (to compare them);
``--profile FILE`` samples the measured phases with py-spy (``--gil``, raw stacks: one
line per stack and its count; py-spy needs root).

Usage: ``.venv/bin/python bench/chunk_cpu.py [--users 100000] [--lanes 2] [--ios]
[--postgres]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from harness import (
    POSTGRES,
    Audience,
    create_csv_request,
    csv_bytes,
    nginx_responder,
    postgres_database,
    seed_audience,
)
from million import nginx_http2_responder


def claim(request_id: str) -> object:
    from campaign_trigger.config import get_settings
    from campaign_trigger.services import delivery_run
    from campaign_trigger.store.db import session_scope

    with session_scope() as session:
        plan = delivery_run.start_delivery(
            session=session, settings=get_settings(), request_id=request_id
        )
    assert not plan.canceled
    return plan


async def deliver(plan: object, lanes: int) -> int:
    """Every chunk of ``plan`` in ``lanes`` concurrent lanes; the messages sent."""
    from campaign_trigger.services.delivery_run import DeliveryPlan
    from campaign_trigger.tasks.delivery import run_chunk

    assert isinstance(plan, DeliveryPlan)
    todo = iter(range(plan.chunk_count))
    sent = 0

    async def lane() -> None:
        nonlocal sent
        for chunk_no in todo:
            result = await run_chunk(plan, chunk_no)
            assert not result.skipped
            sent += result.outcomes[""]

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return sent


def report(plan: object, copy_to: Path | None) -> int:
    """Write the report files (and mark the request processed); their rows."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.services import reports
    from campaign_trigger.services.delivery_run import DeliveryPlan
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.files import get_storage

    assert isinstance(plan, DeliveryPlan)
    settings = get_settings()
    with session_scope() as session:
        summary = reports.write_reports(
            session=session,
            settings=settings,
            request_id=plan.request_id,
            campaign_id=plan.campaign_id,
            app_ids=[app.app_id for app in plan.apps],
        )
        reports.mark_processed(
            session=session, request_id=plan.request_id, report_paths=summary.report_paths
        )
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        storage = get_storage(settings)
        for key in summary.report_paths:
            with storage.open(key, "rb") as source, (copy_to / Path(key).name).open("wb") as out:
                shutil.copyfileobj(source, out)
    return sum(summary.totals().values())


class CollectorTime:
    """CPU time of the garbage collector's passes (any thread), while counting."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        self.counting = False
        gc.callbacks.append(self._pass)

    def _pass(self, phase: str, info: dict[str, int]) -> None:
        if not self.counting:
            return
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started


def start_profile(path: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling this process, the threads holding the GIL, until stopped."""
    spy = Path(sys.executable).parent / "py-spy"
    argv = [str(spy), "record", "--gil", "-r", "200", "-f", "raw", "-o", str(path)]
    profiler = subprocess.Popen([*argv, "--pid", str(os.getpid())])
    time.sleep(1)  # attached
    return profiler


def stop_profile(profiler: subprocess.Popen[bytes]) -> None:
    profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    profiler.wait(timeout=60)


@contextmanager
def responder(home: Path, *, ios: bool) -> Iterator[None]:
    """nginx answering FCM, or APNs over TLS + h2 (``ios``); the environment points the
    service's global credentials at it."""
    if ios:
        with nginx_http2_responder(home) as url:
            os.environ["CT_APNS_BASE_URL"] = url
            yield
        return
    with nginx_responder() as url:
        os.environ["CT_FCM_BASE_URL"] = url
        os.environ["CT_FCM_TOKEN_URI"] = f"{url}/token"
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--ios", action="store_true", help="iOS devices, APNs over TLS + h2")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--reports", type=Path, help="copy the report files into DIR")
    parser.add_argument("--profile", type=Path, help="py-spy raw stacks into FILE")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ct-chunk-cpu-"))
    os.environ.update({"CT_HOME": str(home), "CT_SECRET_KEY": uuid.uuid4().hex * 2})
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        stack.enter_context(responder(home, ios=args.ios))
        if args.postgres:
            database = stack.enter_context(postgres_database())
            os.environ["CT_DATABASE_URL"] = f"{POSTGRES}/{database}"
        from campaign_trigger.config import get_settings
        from campaign_trigger.deployments.worker import settle_collector
        from campaign_trigger.store.migrate import upgrade

        get_settings.cache_clear()
        upgrade(get_settings().database_url)
        audience: Audience = seed_audience(args.users, platform="ios" if args.ios else "android")
        warm = claim(create_csv_request(audience, csv_bytes(audience.users[:5000])))
        plan = claim(create_csv_request(audience, csv_bytes(audience.users)))
        settle_collector()
        asyncio.run(deliver(warm, 1))

        profiler = start_profile(args.profile) if args.profile else None
        collector = CollectorTime()
        collector.counting = True
        load = os.getloadavg()[0]
        cpu, wall = time.process_time(), time.monotonic()
        sent = asyncio.run(deliver(plan, args.lanes))
        chunks_cpu, chunks_wall = time.process_time() - cpu, time.monotonic() - wall
        cpu = time.process_time()
        rows = report(plan, args.reports)
        report_cpu = time.process_time() - cpu
        collector.counting = False
        if profiler is not None:
            stop_profile(profiler)
    assert sent == rows == args.users, (sent, rows)
    per = 1e6 / args.users
    print(
        f"{args.users} {'iOS' if args.ios else 'Android'} messages, {args.lanes} lanes, "
        f"{'PostgreSQL' if args.postgres else 'SQLite'}, load {load:.1f} → "
        f"{os.getloadavg()[0]:.1f}: chunks {chunks_cpu * per:.1f} µs CPU/msg "
        f"({chunks_wall:.1f} s wall), report {report_cpu * per:.1f} µs CPU/msg, "
        f"total {(chunks_cpu + report_cpu) * per:.1f} µs CPU/msg, of which the garbage "
        f"collector {collector.seconds * per:.1f} µs"
    )


if __name__ == "__main__":
    main()
