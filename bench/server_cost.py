"""What one "send now" request of one message costs the Prefect server, in CPU and calls.

The load-independent figure behind ``request_rate.py``: the stack of that benchmark
(Prefect server on SQLite, the API, one worker at INFO, the sandbox), first idle (the
server's CPU per second with nothing to do), then one-message requests at a fixed rate
below saturation (default 2/s for 30 s). Prints the server's CPU time per request (its
process's user + system time from the first create until every request is processed,
divided by the requests) gross and net of the idle load, and what each request left in
the server's database: flow-run and task-run states, task runs, log lines, artifacts,
events by name. CPU time, not wall time: a busy machine moves it little.

``--access-log`` runs the server at INFO and counts its API calls per request by route
(the logging itself costs the server CPU: do not compare that run's CPU with another's).
``--profile DIR`` samples the server with py-spy meanwhile (``DIR/server.txt``).
``--idle-workers N`` starts N more worker processes for the idle measurement (stopped
before the requests): what each idle worker costs the server.

Usage: ``.venv/bin/python bench/server_cost.py [--rate 2] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from harness import (
    PREFECT_PID,
    Worker,
    member_token,
    private_stack,
    seed_audience,
    start_send_now_stack,
    stop_process,
    token_of,
)
from request_rate import send_at_rate

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ACCESS = re.compile(r'"(GET|POST|PATCH|PUT|DELETE) (/api/[^ ?"]*)')


def _cpu(process: psutil.Process) -> float:
    return float(sum(process.cpu_times()[:2]))


def _processed() -> int:
    """How many of the service's requests are processed (read from its database)."""
    from sqlmodel import Session, func, select

    from campaign_trigger.store.db import get_engine
    from campaign_trigger.store.models import Request, RequestState

    with Session(get_engine()) as session:
        return int(
            session.exec(
                select(func.count())
                .select_from(Request)
                .where(Request.state == RequestState.processed)
            ).one()
        )


def _rows(database: Path) -> dict[str, int]:
    """Rows of the tables a request writes to, and events by name."""
    tables = ["flow_run", "flow_run_state", "task_run", "task_run_state", "log", "artifact"]
    counts: dict[str, int] = {}
    with sqlite3.connect(database) as db:
        for table in tables:
            counts[table] = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 (our names)
        for name, n in db.execute("SELECT event, count(*) FROM events GROUP BY event"):
            counts[f"event {name}"] = n
    return counts


def _calls(log: Path, start: int) -> collections.Counter[str]:
    """API calls in the server's access log from byte ``start`` on, by method and route."""
    calls: collections.Counter[str] = collections.Counter()
    with log.open("rb") as text:
        text.seek(start)
        for line in text.read().decode(errors="replace").splitlines():
            found = _ACCESS.search(line)
            if found:
                calls[f"{found[1]} {_UUID.sub('{id}', found[2])}"] += 1
    return calls


def _idle_cpu(server: psutil.Process, seconds: float) -> float:
    """The server's CPU seconds per second over the next ``seconds``."""
    start, cpu = time.monotonic(), _cpu(server)
    time.sleep(seconds)
    return (_cpu(server) - cpu) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--access-log", action="store_true", help="count API calls by route")
    parser.add_argument("--profile", type=Path, help="py-spy the server into this folder")
    parser.add_argument("--idle-workers", type=int, default=0, help="more workers while idle")
    args = parser.parse_args()
    if args.access_log:
        os.environ["PREFECT_SERVER_LOGGING_LEVEL"] = "INFO"
    with private_stack() as home:
        count = int(args.rate * args.seconds)
        audience = seed_audience(count)
        token = member_token(audience.org_id)
        api, sandbox, processes = start_send_now_stack(home)
        try:
            server = psutil.Process(int(os.environ[PREFECT_PID]))
            if args.idle_workers:
                idlers = [Worker(home) for _ in range(args.idle_workers)]
                time.sleep(5)  # the workers' first polls and registrations
                more = _idle_cpu(server, args.idle_seconds)
                print(f"idle Prefect server CPU, {1 + len(idlers)} workers: {more * 1000:.0f} ms/s")
                for idler in idlers:
                    idler.stop()
            time.sleep(5)  # the worker's first polls and registrations
            idle = _idle_cpu(server, args.idle_seconds)
            print(f"idle Prefect server CPU, 1 worker: {idle * 1000:.0f} ms/s")
            database = home / "prefect.db"
            rows_before = _rows(database)
            log = home / "prefect-server.log"
            log_start = log.stat().st_size
            spy = None
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        *("record", "--pid", str(server.pid), "--rate", "100"),
                        *("--format", "raw", "--nonblocking"),
                        *("--output", str(args.profile / "server.txt")),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            start, cpu_start = time.monotonic(), _cpu(server)
            asyncio.run(send_at_rate(api, token, audience.campaign_id, audience.users, args.rate))
            deadline = time.monotonic() + 120
            while _processed() < count and time.monotonic() < deadline:
                time.sleep(0.2)
            window, used = time.monotonic() - start, _cpu(server) - cpu_start
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=60)
            done = _processed()
            delivered = sum(
                1
                for user in audience.users
                if httpx.get(
                    f"{sandbox}/sandbox/deliveries", params={"token": token_of(user)}
                ).json()
            )
            rows_after = _rows(database)
            print(
                f"{count} requests at {args.rate:g}/s: {done} processed, {delivered} delivered "
                f"in {window:.1f} s; load average {os.getloadavg()[0]:.1f}"
            )
            print(
                f"Prefect server CPU per request: {used / count * 1000:.0f} ms gross, "
                f"{(used - idle * window) / count * 1000:.0f} ms net of its idle load "
                f"({idle * 1000:.0f} ms/s idle)"
            )
            print("per request, rows written:")
            for name in sorted(rows_after):
                added = rows_after[name] - rows_before.get(name, 0)
                if added:
                    print(f"  {added / count:6.2f}  {name}")
            if args.access_log:
                print("per request, API calls (idle polling included):")
                for route, n in _calls(log, log_start).most_common():
                    print(f"  {n / count:6.2f}  {route}")
        finally:
            for process in processes:
                stop_process(process)


if __name__ == "__main__":
    main()
