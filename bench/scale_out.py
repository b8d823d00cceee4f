"""Scale-out: a large request's chunks on several worker processes against one.

Each round sends identical send-now CSV requests of ``--chunks`` chunks of 5,000 users
(one Android device each, FCM answered by a bare nginx), one delivered by a single
``campaign-trigger worker``, another by ``--workers`` (2), each with
``--chunk-concurrency`` chunk slots (the worker's default, 2); each layout's workers are
started for it and warmed up on a request of their own first. Requests of more than
``CT_CHUNKS_PER_RUN`` (10) chunks go out in shares: the request's run delivers shares
from the first on and offers others from the last back as share runs, claimed by
whichever worker has a place for them.

Per request: the chunk phase (from the end of ``prepare delivery`` to the end of the last
``deliver chunk``, read from the task runs, as ``chunk_overhead.py`` does) and how many
chunks each worker process delivered (the request's own shares by the worker that claimed
its run, each share by the one that claimed the share's run: the claim's state message
names the worker). The RESULT line gives the workers' chunk phase against one worker's,
medians of the rounds. No target of its own: on this 2-core machine the Prefect
server, nginx and the database share the cores with the workers.

PostgreSQL holds the service's and the Prefect server's data (as for any layout with
more than one worker process; SQLite locks the whole file for every write).

Usage: ``.venv/bin/python bench/scale_out.py [--chunks 30] [--rounds 3] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
from collections.abc import Callable
from pathlib import Path

from chunk_overhead import flow_phase
from harness import (
    Audience,
    Worker,
    create_csv_request,
    csv_bytes,
    nginx_responder,
    private_stack,
    request_run_id,
    result,
    seed_audience,
    share_runs,
    wait_processed,
)


async def chunks_by_worker(request_id: str, chunk_count: int) -> collections.Counter[int]:
    """How many of the request's chunks each worker process (by pid) delivered: its share
    runs' chunks to the worker that claimed each, the rest (the request's own shares) to
    the one that claimed the request's run."""
    from prefect import get_client

    from campaign_trigger.services import prefect_runs

    run_id = request_run_id(request_id)
    counts: collections.Counter[int] = collections.Counter()
    shares = await share_runs(request_id)
    async with get_client() as client:
        runs = [(s.id, len(s.parameters["chunk_nos"])) for s in shares]
        runs.append((run_id, chunk_count - sum(chunks for _, chunks in runs)))
        for flow_run_id, chunks in runs:
            claims = [
                state.message
                for state in await client.read_flow_run_states(flow_run_id)
                if state.name == "Pending" and state.message
            ]
            # "campaign-trigger worker <host>-<pid>-<random>-<queue>"
            name = claims[-1].removeprefix(prefect_runs.WORKER_CLAIM_PREFIX)
            counts[int(name.rsplit("-", 3)[1])] += chunks
    return counts


def delivered_by(
    home: Path,
    workers: int,
    options: tuple[str, ...],
    provider: dict[str, str],
    new_request: Callable[[], str],
    chunk_count: int,
) -> tuple[float, dict[str, int]]:
    """The chunk phase of a request delivered by ``workers`` worker processes (started for
    it, warmed up on a request of their own first), and the chunks each delivered."""
    started = [Worker(home, *options, **provider) for _ in range(workers)]
    try:
        asyncio.run(wait_processed(new_request(), 600))  # warm
        request = new_request()
        asyncio.run(wait_processed(request, 600))
        phase = asyncio.run(flow_phase(request))
        counts = asyncio.run(chunks_by_worker(request, chunk_count))
    finally:
        for worker in started:
            worker.stop()
    by_worker = {f"worker {n + 1}": counts.get(w.process.pid, 0) for n, w in enumerate(started)}
    return phase.seconds, by_worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-concurrency", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="against one")
    args = parser.parse_args()
    options = ("--chunk-concurrency", str(args.chunk_concurrency))
    layouts = (1, args.workers)
    phases: dict[int, list[float]] = {workers: [] for workers in layouts}
    with nginx_responder() as responder, private_stack(postgres=True) as home:
        provider = {"CT_FCM_BASE_URL": responder, "CT_FCM_TOKEN_URI": f"{responder}/token"}
        audience: Audience = seed_audience(args.chunks * 5000)
        content = csv_bytes(audience.users)
        for n in range(args.rounds):
            for workers in layouts:
                seconds, by_worker = delivered_by(
                    home,
                    workers,
                    options,
                    provider,
                    lambda: create_csv_request(audience, content),
                    args.chunks,
                )
                phases[workers].append(seconds)
                print(
                    f"round {n + 1}, {workers} worker(s): {args.chunks} chunks in "
                    f"{seconds:.2f} s ({seconds / args.chunks * 1000:.0f} ms a chunk); chunks "
                    + ", ".join(f"{name} {count}" for name, count in by_worker.items()),
                    flush=True,
                )
    one, many = statistics.median(phases[1]), statistics.median(phases[args.workers])
    result(
        "scale_out",
        f"chunk phase of {args.chunks} chunks of 5,000 on {args.workers} worker processes, "
        f"median of {args.rounds}",
        figure=f"{many:.2f} s",
        reference=f"{one:.2f} s on one worker process, same run",
        ratio=many / one,
        target="none of its own (2 cores shared with the Prefect server and nginx)",
        met=None,
        why="a diagnostic",
    )


if __name__ == "__main__":
    main()
