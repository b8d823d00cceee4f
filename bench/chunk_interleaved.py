"""Per-chunk orchestration overhead measured inside one worker, in one flow run: every
other chunk of a request delivered without its task run.

``chunk_overhead.py`` compares two processes in turns, ~12 s apart: a worker's flow run
and the services alone in the benchmark's process. What it finds (+6.7 % over 108 rounds,
docs/benchmarks.md) holds the orchestration of each chunk, but also whatever makes one
process slower than another at the same work, and the machine's drift between the two
phases (a round swings by ±15 %). Here the worker delivers each request's chunks two
ways, alternating: one as always, the ``deliver chunk`` task run of the request's flow
run (or of a share run); the next the same body (read the chunk, ``process_chunk`` in a
session) awaited with no task run, in a ``contextvars`` context of its own (no Prefect
context: no run logger, no task-run state events, no log line). Both kinds run in the
same process, in the same flow run, one after the other, with the worker's heartbeats,
watches and upkeep around both; what differs between them is the task run.

Each round is a request of ``--chunks`` chunks of 5,000 users (one Android device each,
FCM answered by a bare nginx), its chunks in pairs (0, 1), (2, 3)...; in each round the
kind that runs first in a pair alternates, so that whatever a chunk's place in the run
does (a share's first chunk, the run's last) falls on both kinds alike. The overhead of a
round is the median of its pairs' ``task / bare - 1`` (wall times: a chunk's time, as the
target says; the machine's speed cancels within a pair, a second apart), plus the time in
which no chunk ran, between the first chunk's start and the last's end, a chunk (share
runs claimed, slots handed on, the loop between chunks), plus the CPU spent beside the
chunks while they ran (below), a chunk, both as shares of the median bare chunk. The
figure is the median of the rounds' overheads.

What a pair cannot see is the work the process does beside a chunk while it runs: the
request's run around its chunks (the shares it offers, its progress), the worker's polls,
watches and upkeep, Prefect's threads (a task run's state events and log line, sent
after it, may fall on the next chunk, bare or not). It slows both kinds alike, so the
worker counts it apart (``bare_chunks.Beside``): the CPU, while a chunk runs, of the
event loop's callbacks outside the chunk's context, of the pool threads' calls outside
it, and of every other thread. A round adds it, a chunk, as a share of the median bare
chunk: on one CPU (``--pin``) that CPU is time taken from the chunk; unpinned, part of it
may run on the other CPU, and the figure overstates. With ``--pin`` the Prefect server
and nginx are on the other CPU, so the server's work for a task run does not take turns
with the next chunk. The request's preparation and report are per request, not per
chunk, and are not in the chunk phase.

The worker is ``campaign-trigger worker`` started through ``bench/bare_chunks.py``,
which swaps the flows' ``deliver_chunk`` for the alternation above and logs each chunk's
kind and span; nothing in ``src/`` knows of it.

Usage: ``.venv/bin/python bench/chunk_interleaved.py [--chunks 40] [--rounds 12] [--pin]``
(fewer than 12 rounds print figures but no verdict).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from dataclasses import dataclass

from bare_chunks import BARE, CHUNK_LOG, WORKER, Chunk, read_chunks
from chunk_overhead import JUDGED_ROUNDS, TARGET, idle_seconds
from harness import (
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
    wait_processed,
)


@dataclass(frozen=True)
class Round:
    """A request's chunks, as the worker delivered them two ways."""

    pairs: list[float]  # each pair's task / bare - 1
    task_ms: float  # the task runs' median
    bare_ms: float  # the bare chunks' median
    idle: float  # seconds no chunk ran, from the first chunk's start to the last's end
    beside: tuple[float, float, float]  # seconds of CPU beside the chunks: loop, pool, threads
    chunks: int

    def _share(self, seconds: float) -> float:
        """``seconds`` over the request, a chunk, against the bare chunk."""
        return seconds / self.chunks / (self.bare_ms / 1000)

    @property
    def idle_share(self) -> float:
        """The time no chunk ran, a chunk, against the bare chunk."""
        return self._share(self.idle)

    @property
    def beside_share(self) -> float:
        """The CPU spent beside the chunks while they ran, a chunk, against the bare chunk."""
        return self._share(sum(self.beside))

    @property
    def overhead(self) -> float:
        return statistics.median(self.pairs) + self.idle_share + self.beside_share


def round_of(chunks: list[Chunk]) -> Round:
    """The figures of one request's chunks (pairs (0, 1), (2, 3)...; an odd last one is
    in the medians and the idle time, not in a pair)."""
    pairs = []
    for first, second in zip(chunks[::2], chunks[1::2], strict=False):
        assert first.bare != second.bare, (first, second)
        task, bare = (second, first) if first.bare else (first, second)
        pairs.append(task.seconds / bare.seconds - 1)
    return Round(
        pairs=pairs,
        task_ms=statistics.median(c.seconds for c in chunks if not c.bare) * 1000,
        bare_ms=statistics.median(c.seconds for c in chunks if c.bare) * 1000,
        idle=idle_seconds([(chunk.start, chunk.end) for chunk in chunks]),
        beside=(
            sum(chunk.beside[0] for chunk in chunks),
            sum(chunk.beside[1] for chunk in chunks),
            sum(chunk.beside[2] for chunk in chunks),
        ),
        chunks=len(chunks),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=JUDGED_ROUNDS)
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args()
    if args.chunks < 2:
        parser.error("--chunks: at least 2, a pair")
    rounds: list[Round] = []
    with nginx_responder() as responder, private_stack() as home:
        provider = {"CT_FCM_BASE_URL": responder, "CT_FCM_TOKEN_URI": f"{responder}/token"}
        from campaign_trigger.config import get_settings

        get_settings.cache_clear()
        audience = seed_audience(args.chunks * 5000)
        content = csv_bytes(audience.users)
        away = pin_apart(0) if args.pin else None  # before the worker starts: it inherits
        if away:
            print(f"pinned: the worker on CPU 0, the server and nginx on {sorted(away)}")
        log = home / "chunks.log"
        worker = Worker(
            home,
            "--chunk-concurrency",
            "1",
            command=WORKER,
            **provider,
            **{CHUNK_LOG: str(log), BARE: "alternate"},
        )
        try:
            with moved_to(away) if away else contextlib.nullcontext():
                asyncio.run(wait_processed(create_csv_request(audience, content), 600))  # warm
                for n in range(args.rounds):
                    request_id = create_csv_request(audience, content)
                    asyncio.run(wait_processed(request_id, 600))
                    this = round_of(read_chunks(log, request_id))
                    rounds.append(this)
                    print(
                        f"round {n + 1}: {this.chunks} chunks - task runs {this.task_ms:.0f} ms, "
                        f"bare {this.bare_ms:.0f} ms (medians); pairs task / bare "
                        f"{statistics.median(this.pairs):+.2%} (median of {len(this.pairs)}, "
                        f"{min(this.pairs):+.1%} to {max(this.pairs):+.1%}); no chunk running "
                        f"{this.idle:.2f} s ({this.idle_share:+.2%} a chunk); CPU beside the "
                        f"chunks {this.beside_share:+.2%} a chunk (ms a chunk: loop "
                        f"{this.beside[0] / this.chunks * 1000:.1f}, pool "
                        f"{this.beside[1] / this.chunks * 1000:.1f}, other threads "
                        f"{this.beside[2] / this.chunks * 1000:.1f}); overhead "
                        f"{this.overhead:+.2%}",
                        flush=True,
                    )
        finally:
            worker.stop()
    overheads = [r.overhead for r in rounds]
    median = statistics.median(overheads)
    low, high, confidence = median_interval(overheads)
    pairs = statistics.median(statistics.median(r.pairs) for r in rounds)
    idle = statistics.median(r.idle_share for r in rounds)
    beside = statistics.median(r.beside_share for r in rounds)
    print(
        f"the median overhead {median:+.2%} (medians: pairs {pairs:+.2%}, no chunk running "
        f"{idle:+.2%}, CPU beside the chunks {beside:+.2%}); "
        f"where the median of such rounds lies, from these {len(rounds)}: {low:+.1%} to "
        f"{high:+.1%} ({confidence:.1%} confidence)"
    )
    judged = args.rounds >= JUDGED_ROUNDS
    result(
        "chunk_interleaved",
        f"a chunk as a task run against the same chunk bare, in one worker's flow run, with "
        f"the time between chunks and the CPU beside them, {args.chunks} chunks of 5,000, "
        f"overhead per round, median of {args.rounds}",
        figure=f"{median:+.2%} a chunk",
        reference=f"{statistics.median(r.bare_ms for r in rounds):.0f} ms per bare chunk "
        "(the same worker, no task run)",
        ratio=1 + median,
        target=f"overhead <= {TARGET:.0%} of the chunk (ratio <= {1 + TARGET:.2f})",
        met=median <= TARGET if judged else None,
        why="" if judged else f"a median of {args.rounds}: a verdict needs {JUDGED_ROUNDS}",
    )


if __name__ == "__main__":
    main()
