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

each bare chunk awaited in a ``contextvars`` context of its own holding nothing but the
chunk mark below, inside the run as it is, with everything around it (the run's shares,
slots, progress, heartbeats, the worker's watches). Each chunk's kind and span
(``time.time()``) goes to the file named by ``CT_BENCH_CHUNK_LOG``, a line each:
``request chunk kind start end``, followed with ``alternate`` by the CPU the process
spent beside the chunk while it ran (:class:`Beside`), ``loop pool threads`` in seconds.
Nothing in ``src/`` knows of the swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import sys
import threading
import time
from concurrent.futures import thread as pool_thread
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.utilities.annotations import quote

    from campaign_trigger.services.delivery_run import DeliveryPlan

CHUNK_LOG = "CT_BENCH_CHUNK_LOG"
BARE = "CT_BENCH_BARE"
WORKER = [sys.executable, __file__]  # harness.Worker's command: this file as the worker


# Set in the context a chunk's work runs in: its callbacks on the event loop and what it
# hands to the pool's threads (``asyncio.to_thread``, ``db.in_thread``) carry it.
IN_CHUNK: contextvars.ContextVar[bool] = contextvars.ContextVar("ct_bench_in_chunk", default=False)


class Beside:
    """The CPU the worker process spends beside the chunk that is running, while it runs:
    what a chunk's pair does not see, since it slows both kinds alike.

    * ``loop``: the event loop's callbacks on the main thread that are not the chunk's
      (other runs, the request's run around its chunk: shares offered, progress, the
      worker's polls, watches and upkeep). A callback is the chunk's when its context
      carries :data:`IN_CHUNK` as it starts, or when it hands a thread's result to a
      future awaited there (``_chain_future``'s ``_set_state``). The loop's wake-ups by
      threads (``_read_from_self``) count as the chunk's: its pool calls are ~98 % of
      them;
    * ``pool``: the pool threads' calls whose context does not carry it;
    * ``threads``: every other thread (Prefect's event and log threads, the run
      heartbeats, the freeze watch), from ``/proc``.

    Counted only while a chunk runs (:meth:`chunk`), one at a time (the worker's
    ``--chunk-concurrency 1``); between chunks the time no chunk ran is counted whole
    (``chunk_interleaved``'s idle time). Timing each callback takes two clock reads, in
    both kinds of chunk alike.
    """

    def __init__(self) -> None:
        self.running = False
        self.loop = 0.0
        self.pool = 0.0
        self._lock = threading.Lock()
        self._main = threading.main_thread().ident

    def install(self) -> None:
        run_handle = asyncio.events.Handle._run
        run_item = pool_thread._WorkItem.run

        def handle_run(handle: asyncio.events.Handle) -> None:
            if not self.running or threading.get_ident() != self._main or self._the_chunks(handle):
                return run_handle(handle)
            started = time.thread_time()
            try:
                return run_handle(handle)
            finally:
                self.loop += time.thread_time() - started

        def item_run(item: pool_thread._WorkItem) -> None:  # type: ignore[type-arg]
            if not self.running:
                return run_item(item)
            started = time.thread_time()
            try:
                return run_item(item)
            finally:
                # to_thread and in_thread hand the pool partial(context.run, call, ...)
                context = getattr(getattr(item.fn, "func", None), "__self__", None)
                if not (isinstance(context, contextvars.Context) and context.get(IN_CHUNK)):
                    with self._lock:
                        self.pool += time.thread_time() - started

        asyncio.events.Handle._run = handle_run  # type: ignore[method-assign]
        pool_thread._WorkItem.run = item_run  # type: ignore[method-assign]

    @staticmethod
    def _the_chunks(handle: asyncio.events.Handle) -> bool:
        """Whether the callback is the running chunk's work (the class's docstring)."""
        if handle._context.get(IN_CHUNK):  # type: ignore[attr-defined]
            return True
        callback = handle._callback  # type: ignore[attr-defined]
        if getattr(callback, "__name__", "") == "_read_from_self":
            return True
        args = handle._args  # type: ignore[attr-defined]
        future = args[0] if args else None
        return asyncio.isfuture(future) and any(
            context.get(IN_CHUNK)
            for _, context in future._callbacks or ()  # type: ignore[attr-defined]
        )

    @staticmethod
    def threads_cpu() -> float:
        """Seconds of CPU of the process's threads other than the main one and the
        pool's (named ``asyncio_N``)."""
        total = 0
        for thread in threading.enumerate():
            if thread is threading.main_thread() or thread.name.startswith("asyncio_"):
                continue
            try:
                with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except (OSError, ValueError):  # ended meanwhile
                continue
        return total / 1e9

    def chunk(self) -> _Counting:
        return _Counting(self)


class _Counting:
    """One chunk's span for :class:`Beside`: its counts from enter to exit."""

    def __init__(self, beside: Beside) -> None:
        self.beside = beside
        self.loop = self.pool = self.threads = 0.0

    def __enter__(self) -> _Counting:
        beside = self.beside
        self._start = (beside.loop, beside.pool, beside.threads_cpu())
        beside.running = True
        return self

    def __exit__(self, *exc: object) -> None:
        beside = self.beside
        beside.running = False
        loop, pool, threads = self._start
        self.loop = beside.loop - loop
        self.pool = beside.pool - pool
        self.threads = beside.threads_cpu() - threads


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
    beside = None if every else Beside()
    if beside is not None:
        beside.install()
    with Path(os.environ[CHUNK_LOG]).open("a", buffering=1) as log:  # a line a chunk

        async def swapped(quoted: quote[DeliveryPlan], chunk_no: int) -> None:
            plan = quoted.unquote()
            first = bare_first.setdefault(plan.request_id, len(bare_first) % 2 == 1)
            bare = every or (chunk_no % 2 == 0) == first
            counting = beside.chunk() if beside is not None else contextlib.nullcontext()
            started = time.time()
            mark = IN_CHUNK.set(True)  # the run's wake-up at the chunk's end is the chunk's
            try:
                with counting:
                    if bare:
                        own = contextvars.Context()
                        own.run(IN_CHUNK.set, True)
                        await asyncio.create_task(deliver_chunk_body(plan, chunk_no), context=own)
                    else:
                        await as_task(quoted, chunk_no)
            finally:
                IN_CHUNK.reset(mark)
            ended = time.time()
            kind = "bare" if bare else "task"
            line = f"{plan.request_id} {chunk_no} {kind} {started} {ended}"
            if isinstance(counting, _Counting):
                line += f" {counting.loop} {counting.pool} {counting.threads}"
            log.write(line + "\n")

        deliver.deliver_chunk = swapped  # type: ignore[assignment]  # the flows' name
        sys.argv = ["campaign-trigger", "worker", *argv]
        cli.main()


@dataclass(frozen=True)
class Chunk:
    number: int
    bare: bool
    start: float
    end: float
    beside: tuple[float, float, float] = (0.0, 0.0, 0.0)  # loop, pool, threads (Beside)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def read_chunks(log: Path, request_id: str) -> list[Chunk]:
    """The request's chunks from the worker's log, in chunk order."""
    chunks = []
    for line in log.read_text().splitlines():
        request, number, kind, start, end, *beside = line.split()
        if request == request_id:
            loop, pool, threads = map(float, beside or ("0", "0", "0"))  # --bare: none
            chunks.append(
                Chunk(int(number), kind == "bare", float(start), float(end), (loop, pool, threads))
            )
    return sorted(chunks, key=lambda chunk: chunk.number)


if __name__ == "__main__":
    serve_worker(sys.argv[1:], every=os.environ[BARE] == "every")
