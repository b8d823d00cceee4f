"""What one share run costs: a ``deliver-chunks`` subflow run of a large request.

The load-independent figure behind ``chunk_overhead.py --chunks 40``: there the share
runs' cost hides in ±15 % of noise per round; here it is counted in CPU time. Each round
sends ``--requests`` send-now CSV requests of ``--chunks`` chunks of ``--chunk-size``
messages (one Android device each, FCM answered by a bare nginx: the chunks' own work is
small) through a worker with two chunk slots (the default), in two layouts, one after the
other:

* reference: ``CT_CHUNKS_PER_RUN`` = ``--chunks``, every chunk in the request's own run;
* shares: ``CT_CHUNKS_PER_RUN`` = 1, shares of one chunk: the request's run delivers
  some itself, and the worker's second chunk slot claims each share run it offers (about
  half of them: how many is read from Prefect for each request).

Per request, the Prefect server's and the worker's CPU (user + system, net of each
one's idle load measured before the round), the wall time from creation until the
request is processed, and its share runs. A share run's cost is the difference between
the layouts' medians divided by the mean share runs per request. Also printed, per share
run: what it left in the Prefect server's database (flow and task runs, states, logs,
events) and, with ``--access-log``, the server's API
calls by route (the logging costs the server CPU: do not compare that run's CPU).

The RESULT line gives a share run's CPU (server and worker) against a chunk's in the
reference layout. No target of its own: ``chunk_overhead.py`` decides the per-chunk one.

Usage: ``.venv/bin/python bench/share_cost.py [--chunks 40] [--requests 3] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from chunk_overhead import cpu_seconds
from harness import (
    PREFECT_PID,
    Worker,
    create_csv_request,
    csv_bytes,
    nginx_responder,
    private_stack,
    result,
    seed_audience,
    share_runs,
    task_runs_recorded,
    wait_processed,
)
from server_cost import _calls, _rows

IDLE_SECONDS = 5.0


@dataclass(frozen=True)
class Cost:
    """One request's: the server's and the worker's CPU seconds (net of idle), its wall."""

    server: float
    worker: float
    wall: float
    share_runs: int = 0


def idle_rates(server: psutil.Process, worker: psutil.Process) -> tuple[float, float]:
    """CPU seconds per second of the server and the worker with nothing to deliver."""
    started, server_cpu, worker_cpu = time.monotonic(), cpu_seconds(server), cpu_seconds(worker)
    time.sleep(IDLE_SECONDS)
    seconds = time.monotonic() - started
    return (
        (cpu_seconds(server) - server_cpu) / seconds,
        (cpu_seconds(worker) - worker_cpu) / seconds,
    )


def layout_costs(
    home: Path,
    server: psutil.Process,
    *,
    per_run: int,
    requests: int,
    new_request: Callable[[], str],
    provider: dict[str, str],
) -> list[Cost]:
    """The cost of each of ``requests`` requests through a worker of this layout."""
    worker = Worker(home, CT_CHUNKS_PER_RUN=str(per_run), **provider)
    process = psutil.Process(worker.process.pid)
    try:
        asyncio.run(wait_processed(new_request(), 600))  # warm: the worker's first run
        server_idle, worker_idle = idle_rates(server, process)
        costs = []
        for _ in range(requests):
            server_cpu, worker_cpu = cpu_seconds(server), cpu_seconds(process)
            started = time.monotonic()
            request_id = new_request()
            asyncio.run(wait_processed(request_id, 600))
            wall = time.monotonic() - started
            costs.append(
                Cost(
                    server=cpu_seconds(server) - server_cpu - server_idle * wall,
                    worker=cpu_seconds(process) - worker_cpu - worker_idle * wall,
                    wall=wall,
                    share_runs=len(asyncio.run(share_runs(request_id))),
                )
            )
        return costs
    finally:
        worker.stop()


def median_cost(costs: list[Cost]) -> Cost:
    return Cost(
        server=statistics.median(c.server for c in costs),
        worker=statistics.median(c.worker for c in costs),
        wall=statistics.median(c.wall for c in costs),
        share_runs=round(statistics.median(c.share_runs for c in costs)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--chunk-size", type=int, default=10)
    parser.add_argument("--requests", type=int, default=3, help="per layout and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--access-log", action="store_true", help="count API calls by route")
    args = parser.parse_args()
    if args.chunks < 2:
        parser.error("--chunks: at least 2 (one share run)")
    if args.access_log:
        os.environ["PREFECT_SERVER_LOGGING_LEVEL"] = "INFO"
    os.environ["CT_CHUNK_SIZE"] = str(args.chunk_size)  # the requests are chunked here
    layouts = {"reference": args.chunks, "shares": 1}
    costs: dict[str, list[Cost]] = {name: [] for name in layouts}
    added: dict[str, dict[str, int]] = {name: {} for name in layouts}
    calls: dict[str, dict[str, int]] = {name: {} for name in layouts}
    with nginx_responder() as responder, private_stack() as home:
        provider = {"CT_FCM_BASE_URL": responder, "CT_FCM_TOKEN_URI": f"{responder}/token"}
        audience = seed_audience(args.chunks * args.chunk_size)
        content = csv_bytes(audience.users)
        server = psutil.Process(int(os.environ[PREFECT_PID]))
        database, log = home / "prefect.db", home / "prefect-server.log"
        for n in range(args.rounds):
            for name, per_run in layouts.items():
                rows, log_start = _rows(database), log.stat().st_size
                got = layout_costs(
                    home,
                    server,
                    per_run=per_run,
                    requests=args.requests,
                    new_request=lambda: create_csv_request(audience, content),
                    provider=provider,
                )
                costs[name] += got
                asyncio.run(task_runs_recorded())  # every row of the layout's task runs
                for key, count in _rows(database).items():  # the warm-up request's too
                    added[name][key] = added[name].get(key, 0) + count - rows.get(key, 0)
                for route, count in _calls(log, log_start).items():
                    calls[name][route] = calls[name].get(route, 0) + count
                typical = median_cost(got)
                print(
                    f"round {n + 1}, {name} (CT_CHUNKS_PER_RUN {per_run}): per request "
                    f"server {typical.server * 1000:.0f} ms CPU, worker "
                    f"{typical.worker * 1000:.0f} ms CPU, {typical.wall:.2f} s "
                    f"({args.chunks} chunks of {args.chunk_size})",
                    flush=True,
                )
    own, shared = median_cost(costs["reference"]), median_cost(costs["shares"])
    # share runs per request (the warm-up requests' rows and calls are counted as the mean's)
    shares = statistics.mean(c.share_runs for c in costs["shares"])
    if not shares:
        raise SystemExit("no share run was made: nothing to measure")
    per_share = Cost(
        server=(shared.server - own.server) / shares,
        worker=(shared.worker - own.worker) / shares,
        wall=(shared.wall - own.wall) / shares,
    )
    print(
        f"per share run: server {per_share.server * 1000:.0f} ms CPU, worker "
        f"{per_share.worker * 1000:.0f} ms CPU, {per_share.wall * 1000:.0f} ms wall "
        f"(medians of {len(costs['shares'])} requests per layout, {shares:.1f} share runs "
        f"of {args.chunks - 1} shares offered per request)"
    )
    requests = args.rounds * (args.requests + 1)  # each worker's warm-up request too
    print("per share run, rows and events left in the Prefect server's database:")
    for key in sorted(set(added["reference"]) | set(added["shares"])):
        more = (added["shares"].get(key, 0) - added["reference"].get(key, 0)) / requests
        if more:
            print(f"  {more / shares:6.2f}  {key}")
    if args.access_log:
        print("per share run, API calls (idle polling included):")
        routes = set(calls["reference"]) | set(calls["shares"])
        for route in sorted(routes, key=lambda r: -calls["shares"].get(r, 0)):
            more = (calls["shares"].get(route, 0) - calls["reference"].get(route, 0)) / requests
            if abs(more / shares) >= 0.05:
                print(f"  {more / shares:6.2f}  {route}")
    chunk = (own.server + own.worker) / args.chunks
    share = per_share.server + per_share.worker
    result(
        "share_cost",
        f"CPU of a share run (Prefect server + worker), chunks of {args.chunk_size}",
        figure=f"{share * 1000:.0f} ms per share run",
        reference=f"{chunk * 1000:.0f} ms per chunk delivered in the request's own run",
        ratio=share / chunk,
        target="none of its own (chunk_overhead.py: per-chunk overhead <= 5 %)",
        met=None,
        why="a diagnostic",
    )


if __name__ == "__main__":
    main()
