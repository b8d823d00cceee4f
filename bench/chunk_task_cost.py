"""What a chunk's task run costs the flow that runs it: Prefect's task engine around
the ``deliver chunk`` body.

``chunk_overhead.py`` compares whole chunk phases, whose noise (±10 % a round) hides a
few milliseconds a chunk. Here the body does nothing, so what is timed is the engine
alone: the task run's creation, its states (events), its context, its arguments' walk,
its run name. One flow run on the stack's Prefect server calls the real ``deliver chunk``
task (its options, its run name) ``--runs`` times with a real request's plan, the two
ways interleaved so that the machine's drift hits both alike:

* as the flow calls it: ``deliver_chunk(quote(plan), n)``, the task made once;
* the reference, as it was called before 2026-11-27: a copy of the task per chunk
  (``with_options(task_run_name=...)``, which hashes the function's source) and the
  plan walked by Prefect before each run (``plan.recorded`` emptied, as then).

Prints the median wall time of each, from the call to its return. No target of its own
(``chunk_overhead.py`` decides the per-chunk one): the RESULT line says what one chunk's
task run costs, against the reference.

Then ``--runs`` / 2 more task runs as the flow calls them, one after the other, and the
CPU each thread of this process spent on them, per task run: the flow's own thread (the
engine), Prefect's global loop thread (where the state events are sent) and its events
worker. The wall time above leaves out what the two background threads do after the
call returns; their CPU is the per-chunk cost a worker pays beside its chunks.

Usage: ``.venv/bin/python bench/chunk_task_cost.py [--runs 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import threading
import time
from pathlib import Path

from chunk_overhead import claim
from harness import create_csv_request, csv_bytes, private_stack, result, seed_audience


async def _nothing(plan: object, chunk_no: int) -> None:
    return None


SETTLE_SECONDS = 2.0  # for the background threads to send what the task runs left them


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by its Python name."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        name = names.get(int(task.name), f"thread {task.name}")
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with private_stack():
        from prefect import flow
        from prefect.utilities.annotations import quote

        from campaign_trigger.config import get_settings
        from campaign_trigger.tasks.delivery import deliver_chunk

        get_settings.cache_clear()
        audience = seed_audience(10_000)
        plan = claim(create_csv_request(audience, csv_bytes(audience.users)))
        chunk_task = deliver_chunk.with_options()  # the real options and run name
        chunk_task.fn = _nothing
        now: list[float] = []
        before: list[float] = []

        @flow(name="chunk-task-cost", persist_result=False)
        async def calls() -> None:
            walked = dataclasses.replace(plan, recorded=set())
            for n in range(args.runs):
                started = time.perf_counter()
                if n % 2:
                    await chunk_task.with_options(
                        task_run_name=f"deliver chunk {n + 1}/{plan.chunk_count}"
                    )(walked, n)
                    before.append(time.perf_counter() - started)
                else:
                    await chunk_task(quote(plan), n)
                    now.append(time.perf_counter() - started)
            await asyncio.sleep(SETTLE_SECONDS)
            cpu_before = thread_cpu()
            for n in range(alone):
                await chunk_task(quote(plan), n)
            await asyncio.sleep(SETTLE_SECONDS)
            cpu_after = thread_cpu()
            threads.update(
                {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
            )

        alone = args.runs // 2
        threads: dict[str, float] = {}
        asyncio.run(calls())
    warm = args.runs // 10  # the first runs pay imports and connections
    figure = statistics.median(now[warm:]) * 1000
    reference = statistics.median(before[warm:]) * 1000
    print(f"a chunk's task run, as the flow calls it: {figure:.2f} ms (median of {len(now)})")
    print(f"as called before (a task per chunk, the plan walked): {reference:.2f} ms")
    print(f"CPU per task run, {alone} as the flow calls them, by thread:")
    for name, seconds in sorted(threads.items(), key=lambda item: -item[1]):
        if seconds > 0:
            print(f"  {name}: {seconds / alone * 1000:.2f} ms")
    print(f"  all threads: {sum(threads.values()) / alone * 1000:.2f} ms")
    result(
        "chunk_task_cost",
        "Prefect's task engine around one chunk's body (the body does nothing)",
        figure=f"{figure:.2f} ms per chunk task run",
        reference=f"{reference:.2f} ms (a task copy per chunk and the plan walked, as before)",
        ratio=figure / reference,
        target="none of its own (chunk_overhead.py decides the per-chunk target)",
        met=None,
        why="a cost measured, not a target",
    )


if __name__ == "__main__":
    main()
