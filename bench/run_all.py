"""``make bench``: every benchmark of ``bench/``, one after the other, quick or full.

Quick mode (the default) runs each with small sizes and one round, to see in a few
minutes that every benchmark runs and where each figure stands; ``--full`` (``make bench
FULL=1``) runs them with their own defaults (the 1 M rows). Each benchmark prints its
figure, its reference measured in the same run and the ratio; this runner adds the
machine's load average before each and a summary: which ran, in how long, exit status.

Usage: ``.venv/bin/python bench/run_all.py [--full] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

# name -> (quick arguments, full arguments)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "render": (["200000"], []),
    "ingest": (["--rows", "200000", "--repeat", "3"], ["--rows", "5000000"]),
    "delivery": (["-n", "10000", "--rounds", "1"], []),
    "apns_http2": (["--quick"], []),
    "device_import": (["--quick"], []),
    "sandbox": (["-n", "50000", "--rounds", "1"], []),
    "sandbox_end_to_end": (["--users", "20000", "--rounds", "1"], []),
    "punctuality": (["--scheduled", "10", "--now", "3"], []),
    "request_rate": (["--rates", "3", "--seconds", "10", "--reference-runs", "10"], []),
    "api_creates": (["--rates", "10", "25", "--seconds", "10", "--workers", "1"], []),
    "worker_memory": (["--sizes", "20000", "100000"], []),
    "million": (["--users", "100000"], []),
    "chunk_dispatch": (["--rounds", "1", "--chunks", "6", "--probes", "2"], []),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="each benchmark's full sizes")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    args = parser.parse_args()
    summary: list[tuple[str, int, float, float]] = []
    started = time.monotonic()
    for name in args.only:
        quick, full = BENCHMARKS[name]
        arguments = full if args.full else quick
        load = os.getloadavg()[0]
        print(f"\n=== {name} {' '.join(arguments)} (load average {load:.1f})", flush=True)
        begun = time.monotonic()
        status = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py"), *arguments], check=False
        ).returncode
        summary.append((name, status, time.monotonic() - begun, load))
    print(f"\n=== {'full' if args.full else 'quick'} run, {time.monotonic() - started:.0f} s:")
    for name, status, seconds, load in summary:
        outcome = "ran" if status == 0 else f"FAILED (exit {status})"
        print(f"  {name:20s} {outcome:18s} {seconds:6.0f} s  (load average {load:.1f} at start)")
    return 1 if any(status for _, status, _, _ in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
