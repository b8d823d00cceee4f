"""Where the per-chunk overhead lies: a worker and a contender delivering the same
chunks at the same time on one CPU, their CPU a chunk compared.

``chunk_overhead.py`` times the flow path and the reference in turns, ~12 s apart, and the
machine's speed moves between them by more than the overhead it looks for (one round
swings by ±15 %, a median of 12 rounds by several points). Here both deliver **at once**,
each a request of ``--chunks`` chunks of 5,000 users (one Android device each, FCM
answered by a bare nginx), both on CPU 0; the Prefect server, nginx and this process on
the other CPU(s) (``harness.pin_apart``). A thread on those other CPUs reads both
processes' CPU (every thread's ``/proc`` ``schedstat``) every 20 ms. Over the window in
which both deliver chunks, each process's CPU is divided by the chunks it delivered in it
(a chunk partly inside counted by the share of its span inside): whatever the machine
does then, it does to both, and a round's ratio moves by about two points where
``chunk_overhead``'s move by twenty.

* the worker: a ``campaign-trigger worker`` process claims the request's flow run and
  delivers it, its chunks read from Prefect's task runs; ``--worker-env NAME=VALUE`` sets
  its environment (a setting's cost, e.g. ``CT_CHUNKS_PER_RUN=100``: no share run);
* the contender (``--contender``), a process started once that claims its requests
  itself (no worker ever runs them): ``engine`` runs each chunk as the ``deliver chunk``
  task of a flow run of its own (Prefect's task engine, its events and logs to the same
  server, no worker around it); ``services`` runs each chunk's body with the services
  alone, as ``chunk_overhead``'s reference does.

What it cannot say: a process's CPU a chunk depends on what runs beside it (the two take
turns on the CPU's caches), so a pair compares like with like only when the two are
alike; and each one's wall time a chunk about doubles, so what a process spends by the
second rather than by the chunk (upkeep loops, progress updates, heartbeats) counts about
twice what it does alone. Its figure is not ``chunk_overhead``'s target (a chunk's wall
time, delivered alone): it is a diagnostic, for telling in a few minutes which side of
a change the worker's CPU a chunk falls (docs/benchmarks.md, "Two processes at once on
one CPU").

Usage: ``.venv/bin/python bench/chunk_pair.py [--contender engine|services] [--rounds 6]
[--chunks 40] [--worker-env NAME=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from chunk_overhead import chunk_task_spans, reference_spans, serve_requests
from harness import (
    Answering,
    Worker,
    create_csv_request,
    csv_bytes,
    median_interval,
    moved_to,
    nginx_responder,
    pin_apart,
    private_stack,
    result,
    seed_audience,
    thread_cpu,
    wait_processed,
)

if TYPE_CHECKING:
    from campaign_trigger.services.delivery_run import DeliveryPlan

Spans = list[tuple[float, float]]
SAMPLE_SECONDS = 0.02
# The contender starts this long after the worker's request is created: about when the
# worker, claiming and preparing it, starts its first chunk.
CONTENDER_DELAY = 0.5


def chunks_inside(spans: Spans, start: float, end: float) -> float:
    """How many of the chunks ``spans`` (each one's start and end) ran from ``start`` to
    ``end``, a chunk partly inside counted by the share of its span inside."""
    return sum(
        max(0.0, min(stop, end) - max(begin, start)) / (stop - begin)
        for begin, stop in spans
        if stop > begin
    )


def process_cpu(pid: int) -> float:
    """Process ``pid``'s CPU seconds so far, its live threads summed."""
    return float(sum(thread_cpu(pid).values()))


async def engine_spans(plan: DeliveryPlan) -> Spans:
    """Every chunk of the request as the ``deliver chunk`` task of a flow run of this
    process's own, one after the other; each task run's start and end."""
    from prefect import flow
    from prefect.utilities.annotations import quote

    from campaign_trigger.tasks.delivery import deliver_chunk

    spans: Spans = []
    quoted = cast("DeliveryPlan", quote(plan))  # handed to the task as is, as in a worker

    @flow(name="chunk-pair-contender", persist_result=False)
    async def contender() -> None:
        for chunk_no in range(plan.chunk_count):
            started = time.time()
            await deliver_chunk(quoted, chunk_no)
            spans.append((started, time.time()))

    await contender()
    return spans


class Contender:
    """The contender process, started on this process's CPU, with its requests: it claims
    them, warms up with the first, then delivers one at each :meth:`deliver`
    (``chunk_overhead.serve_requests``); its logs (Prefect's console lines, with
    ``engine``) in ``log_path``."""

    def __init__(self, how: str, request_ids: list[str], log_path: Path) -> None:
        self.child = Answering(
            [sys.executable, __file__, "--contend", how, *request_ids], "the contender", log_path
        )

    def deliver(self) -> Spans:
        """Its next request delivered: its chunks' spans."""
        return [(start, end) for start, end in json.loads(self.child.ask())]

    def stop(self) -> None:
        self.child.stop()


class Sampler:
    """Both processes' CPU every 20 ms, from a thread on ``cpus``."""

    def __init__(self, pids: tuple[int, int], cpus: set[int]) -> None:
        self.samples: list[tuple[float, float, float]] = []  # time.time(), each one's CPU
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pids, cpus), daemon=True)
        self._thread.start()

    def _run(self, pids: tuple[int, int], cpus: set[int]) -> None:
        os.sched_setaffinity(threading.get_native_id(), cpus)
        while not self._stop.is_set():
            self.samples.append((time.time(), process_cpu(pids[0]), process_cpu(pids[1])))
            time.sleep(SAMPLE_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def per_chunk(self, first: Spans, second: Spans) -> tuple[float, float, float, float]:
        """Over the samples where both deliver: the window's seconds, each process's CPU
        seconds a chunk, and the chunks the first delivered in it."""
        start = max(min(begin for begin, _ in spans) for spans in (first, second))
        end = min(max(stop for _, stop in spans) for spans in (first, second))
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        assert len(inside) >= 2, "the two did not deliver at the same time"
        (t0, a0, b0), (t1, a1, b1) = inside[0], inside[-1]
        done = chunks_inside(first, t0, t1)
        return t1 - t0, (a1 - a0) / done, (b1 - b0) / chunks_inside(second, t0, t1), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--contender", choices=["engine", "services"], default="engine")
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--worker-env", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--contend", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contend:
        how, *request_ids = args.contend
        serve_requests(
            request_ids, engine_spans if how == "engine" else reference_spans, json.dumps
        )
        return
    worker_env = dict(pair.split("=", 1) for pair in args.worker_env)
    ratios: list[float] = []
    contender_cpu: list[float] = []
    with nginx_responder() as responder, private_stack() as home:
        provider = {"CT_FCM_BASE_URL": responder, "CT_FCM_TOKEN_URI": f"{responder}/token"}
        os.environ.update(provider)  # the contender sends as the worker does
        audience = seed_audience(args.chunks * 5000)
        content = csv_bytes(audience.users)
        # Created and claimed before any worker runs: no worker ever makes them a run.
        ids = [create_csv_request(audience, content) for _ in range(args.rounds + 1)]
        away = pin_apart(0)  # the contender and the worker inherit CPU 0
        contender = Contender(args.contender, ids, home / "contender.log")
        worker = Worker(home, "--chunk-concurrency", "1", **provider, **worker_env)
        try:
            with worker.unsampled(), moved_to(away):  # this process off CPU 0
                asyncio.run(wait_processed(create_csv_request(audience, content), 600))  # warm
                print(
                    f"the worker against a contender ({args.contender}), both on CPU 0, "
                    f"{args.chunks} chunks of 5,000 each a round; worker environment "
                    f"{worker_env or 'as is'}"
                )
                for n in range(args.rounds):
                    sampler = Sampler((worker.process.pid, contender.child.process.pid), away)
                    request_id = create_csv_request(audience, content)
                    time.sleep(CONTENDER_DELAY)
                    theirs = contender.deliver()
                    asyncio.run(wait_processed(request_id, 600))
                    sampler.stop()
                    _, worker_spans = asyncio.run(chunk_task_spans(request_id))
                    seconds, mine, other, done = sampler.per_chunk(worker_spans, theirs)
                    ratios.append(mine / other - 1)
                    contender_cpu.append(other)
                    print(
                        f"round {n + 1}: over {seconds:.1f} s, the worker "
                        f"{mine * 1000:.1f} ms of CPU a chunk ({done:.1f} chunks), the "
                        f"contender {other * 1000:.1f} ms ({ratios[-1]:+.1%})"
                    )
        finally:
            worker.stop()
            contender.stop()
    median = statistics.median(ratios)
    low, high, confidence = median_interval(ratios)
    print(
        f"the worker's CPU a chunk against the contender's: median {median:+.2%}, lying "
        f"between {low:+.1%} and {high:+.1%} ({confidence:.1%} confidence)"
    )
    result(
        "chunk_pair",
        f"the worker's CPU a chunk against a contender ({args.contender}) delivering at "
        f"the same time on one CPU, {args.chunks} chunks of 5,000, median of {args.rounds}",
        figure=f"{median:+.2%} a chunk",
        reference=f"{statistics.median(contender_cpu) * 1000:.0f} ms of CPU a chunk "
        f"(the contender, {args.contender})",
        ratio=1 + median,
        target="none: a diagnostic of where chunk_overhead's overhead lies",
        met=None,
        why="a diagnostic",
    )


if __name__ == "__main__":
    main()
