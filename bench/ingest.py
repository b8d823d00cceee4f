"""CSV ingest + validation against a bare ``pyarrow.csv.read_csv`` of the same file.

Ingest is what the API does with an upload: stream it into storage (1 MB pieces),
then parse it once, check it with the campaign's pandera model and write the
request's message file (Arrow IPC). Usage::

    .venv/bin/python bench/ingest.py [--rows 1000000] [--repeat 5]

Prints both medians and the ratio (target: at most 1.5, judged on files of at least
1 M rows: below that, fixed costs weigh on the few milliseconds measured).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.csv as pcsv

from campaign_trigger.services.ingest import ingest_message_file
from campaign_trigger.services.uploads import UploadWriter, copy_to_storage
from campaign_trigger.store.files import Storage
from harness import result

VARIABLES = ["first_name", "city", "code"]
TARGET_RATIO = 1.5
VERDICT_ROWS = 1_000_000


def generate(path: Path, rows: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.write("User,first_name,city,code,segment\n")
        for start in range(0, rows, 100_000):
            handle.write(
                "".join(
                    f"user-{i:09d},Prénom{i % 997},Ville-{i % 131},C{i % 7919:05d},s{i % 5}\n"
                    for i in range(start, min(rows, start + 100_000))
                )
            )


def _seconds(action: Callable[[], object]) -> tuple[float, float]:
    """Wall time and this process's CPU time (all threads) of one run."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def _medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def interleaved_medians(
    first: Callable[[], object], second: Callable[[], object], repeat: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Median (wall, CPU) of two actions run turn by turn (load slows both alike)."""
    first(), second()  # warm-up: page cache, imports, the pandera model
    first_runs: list[tuple[float, float]] = []
    second_runs: list[tuple[float, float]] = []
    for _ in range(repeat):
        first_runs.append(_seconds(first))
        second_runs.append(_seconds(second))
    return _medians(first_runs), _medians(second_runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as folder:
        source = Path(folder) / "messages.csv"
        generate(source, args.rows)
        storage = Storage(str(Path(folder) / "storage"))

        def bare() -> object:
            return pcsv.read_csv(source)

        written: list[UploadWriter] = []

        def copy() -> None:
            with source.open("rb") as handle:
                written[:] = [
                    copy_to_storage(
                        handle,
                        storage=storage,
                        key="uploads/bench.csv",
                        max_bytes=2**40,
                        chunk_size=64 * 1024,
                    )
                ]

        def validate() -> int:
            return ingest_message_file(
                storage=storage,
                upload_key="uploads/bench.csv",
                facts=written[0].facts,
                messages_key="messages/bench.arrow",
                variables=VARIABLES,
                chunk_size=5000,
            )

        def ingest() -> int:
            copy()
            return validate()

        assert ingest() == args.rows
        size_mb = source.stat().st_size / 2**20
        (bare_s, bare_cpu), (ingest_s, ingest_cpu) = interleaved_medians(bare, ingest, args.repeat)
        (copy_s, _), (validate_s, validate_cpu) = interleaved_medians(copy, validate, args.repeat)
        print(
            f"file: {args.rows:,} rows, {size_mb:.1f} MB; medians of {args.repeat} "
            "interleaved runs (wall / CPU of all threads)"
        )
        print(f"bare pyarrow.csv.read_csv:             {bare_s:.3f} s / {bare_cpu:.3f} s")
        print(f"ingest (stream to storage + parse):    {ingest_s:.3f} s / {ingest_cpu:.3f} s")
        print(
            f"  stream to storage {copy_s:.3f} s; parse + check + write {validate_s:.3f} s / "
            f"{validate_cpu:.3f} s"
        )
        print(
            f"ratio, wall: {ingest_s / bare_s:.2f}x; "
            f"parse + check + write alone {validate_s / bare_s:.2f}x"
        )
        print(
            f"ratio, CPU:  {ingest_cpu / bare_cpu:.2f}x; parse + check + write alone "
            f"{validate_cpu / bare_cpu:.2f}x"
        )
        ratio = ingest_s / bare_s
        result(
            "ingest",
            f"ingest + validation of {args.rows:,} rows ({size_mb:.0f} MB), wall",
            figure=f"{ingest_s:.3f} s",
            reference=f"{bare_s:.3f} s (bare pyarrow.csv.read_csv)",
            ratio=ratio,
            target=f"<= {TARGET_RATIO}x the bare parse",
            met=ratio <= TARGET_RATIO if args.rows >= VERDICT_ROWS else None,
            why=""
            if args.rows >= VERDICT_ROWS
            else f"quick size: judged from {VERDICT_ROWS:,} rows",
        )


if __name__ == "__main__":
    main()
