"""Worker memory against request size: peak RSS for 100 k and 1 M recipients.

A worker holds one chunk of a request (plus the message file's metadata), not the
request: its peak RSS must stay flat as requests grow. For each size, this starts a
fresh ``campaign-trigger worker`` process, sends a send-now CSV request of that many
users (one Android device each, FCM answered by a bare nginx responder) and samples
the worker's RSS until the request is processed.

Prints the peak RSS per size and the ratio of the largest to the smallest (the
reference, measured in the same run). Target: at most 1.3x.

Usage: ``.venv/bin/python bench/worker_memory.py [--sizes 100000 1000000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from harness import (
    Worker,
    create_csv_request,
    csv_bytes,
    nginx_responder,
    private_stack,
    result,
    seed_audience,
    wait_processed,
)

TARGET = 1.3
VERDICT_SIZE = 1_000_000  # issue 9: flat from 100 k to 1 M recipients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    peaks: dict[int, int] = {}
    with nginx_responder() as responder, private_stack() as home:
        provider = {"CT_FCM_BASE_URL": responder, "CT_FCM_TOKEN_URI": f"{responder}/token"}
        for size in sizes:
            audience = seed_audience(size)
            worker = Worker(home, **provider)
            try:
                started = time.monotonic()
                request_id = create_csv_request(audience, csv_bytes(audience.users))
                created = time.monotonic() - started
                seconds = asyncio.run(wait_processed(request_id, timeout=3600))
            finally:
                worker.stop()
            peaks[size] = worker.peak_rss
            print(
                f"{size:>10,} recipients: worker peak RSS {worker.peak_rss / 2**20:7.1f} MB; "
                f"created in {created:.1f} s, delivered and reported in {seconds:.1f} s "
                f"({size / seconds:,.0f} msgs/s)"
            )
    smallest, largest = sizes[0], sizes[-1]
    ratio = peaks[largest] / peaks[smallest]
    decided = largest >= VERDICT_SIZE
    result(
        "worker_memory",
        f"worker peak RSS, {largest:,} recipients",
        figure=f"{peaks[largest] / 2**20:.0f} MB",
        reference=f"{peaks[smallest] / 2**20:.0f} MB (the same at {smallest:,} recipients)",
        ratio=ratio,
        target=f"<= {TARGET}x from 100,000 to {VERDICT_SIZE:,} recipients",
        met=ratio <= TARGET if decided else None,
        why="" if decided else f"quick size: judged at {VERDICT_SIZE:,} recipients",
    )


if __name__ == "__main__":
    main()
