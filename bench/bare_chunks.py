"""A chunk delivered bare: its body with the services alone, no task run, no Prefect
context; and a ``campaign-trigger worker`` that delivers chunks that way.

``deliver_chunk_body`` is the ``deliver chunk`` task's work (``tasks.delivery.run_chunk``:
read the chunk from the message file, ``process_chunk`` in a session) with no task run
around it: ``chunk_overhead``'s reference runs it in the benchmark's own process. Run as
a script, this file is the worker's command (``python bench/bare_chunks.py <worker
options>``, through ``harness.Worker(command=WORKER)``): it swaps the flows'
``deliver_chunk`` before the worker's command runs, so that the worker's runs deliver

* with ``CT_BENCH_BARE=alternate``, every other chunk of each request bare, the others
  as their task runs, which kind first alternating from one request to the next
  (``chunk_interleaved``);
* with ``CT_BENCH_BARE=every``, every chunk bare (``chunk_overhead --bare``),

each bare chunk awaited in an empty ``contextvars`` context, inside the run as it is,
with everything around it (the run's shares, slots, progress, heartbeats, the worker's
watches). Each chunk's kind and span (``time.time()``) goes to the file named by
``CT_BENCH_CHUNK_LOG``, a line each: ``request chunk kind start end``. Nothing in
``src/`` knows of the swap.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.utilities.annotations import quote

    from campaign_trigger.services.delivery_run import DeliveryPlan

CHUNK_LOG = "CT_BENCH_CHUNK_LOG"
BARE = "CT_BENCH_BARE"
WORKER = [sys.executable, __file__]  # harness.Worker's command: this file as the worker


async def deliver_chunk_body(plan: DeliveryPlan, chunk_no: int) -> None:
    """One chunk of the request delivered with the services alone: the ``deliver chunk``
    task's work (``run_chunk``) with no task run around it."""
    from campaign_trigger.tasks.delivery import run_chunk

    result = await run_chunk(plan, chunk_no)
    assert not result.skipped


def serve_worker(argv: list[str], *, every: bool) -> None:
    """Run ``campaign-trigger worker argv`` with every chunk (``every``) or every other
    chunk of each request delivered bare (module docstring)."""
    from campaign_trigger import cli
    from campaign_trigger.flows import deliver

    as_task = deliver.deliver_chunk
    bare_first: dict[str, bool] = {}  # by request, in the order their first chunks came
    with Path(os.environ[CHUNK_LOG]).open("a", buffering=1) as log:  # a line a chunk

        async def swapped(quoted: quote[DeliveryPlan], chunk_no: int) -> None:
            plan = quoted.unquote()
            first = bare_first.setdefault(plan.request_id, len(bare_first) % 2 == 1)
            bare = every or (chunk_no % 2 == 0) == first
            started = time.time()
            if bare:
                await asyncio.create_task(
                    deliver_chunk_body(plan, chunk_no), context=contextvars.Context()
                )
            else:
                await as_task(quoted, chunk_no)
            kind = "bare" if bare else "task"
            log.write(f"{plan.request_id} {chunk_no} {kind} {started} {time.time()}\n")

        deliver.deliver_chunk = swapped  # type: ignore[assignment]  # the flows' name
        sys.argv = ["campaign-trigger", "worker", *argv]
        cli.main()


@dataclass(frozen=True)
class Chunk:
    number: int
    bare: bool
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def read_chunks(log: Path, request_id: str) -> list[Chunk]:
    """The request's chunks from the worker's log, in chunk order."""
    chunks = []
    for line in log.read_text().splitlines():
        request, number, kind, start, end = line.split()
        if request == request_id:
            chunks.append(Chunk(int(number), kind == "bare", float(start), float(end)))
    return sorted(chunks, key=lambda chunk: chunk.number)


if __name__ == "__main__":
    serve_worker(sys.argv[1:], every=os.environ[BARE] == "every")
