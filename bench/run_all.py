"""``make bench``: every benchmark of ``bench/``, one after the other, quick or full.

Quick mode (the default) runs each with small sizes and one round, to see in a few
minutes that every benchmark runs and where each figure stands; ``--full`` (``make bench
FULL=1``) runs them with their own defaults (the 1 M rows). Each benchmark prints its
details and, per target it measures, one ``RESULT | ...`` line (``harness.result``):
figure, reference measured in the same run, ratio, target, verdict. This runner streams
each benchmark's output as it comes, adds the load average before each, and ends with a
summary: per benchmark its seconds, exit status and RESULT lines; ``--markdown FILE``
writes the same summary as a markdown table (for docs/benchmarks.md).

In quick mode the benchmarks that would each start the same private stack (a Prefect
server on SQLite, a migrated database, the deployments: ``SHARED``) share one, started
before the first of them (its time is a line of the summary); they create their own
organisations and audiences in it. Full mode gives each its own stack.

Usage: ``.venv/bin/python bench/run_all.py [--full] [--only NAME ...] [--markdown FILE]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from harness import RESULT_PREFIX, SEPARATOR, SHARED_STACK, private_stack

HERE = Path(__file__).parent

QUICK_SECONDS = 300  # issue 14: the quick run within 5 minutes
# name -> (quick arguments, full arguments)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "render": (["200000"], []),
    "ingest": (["--rows", "1000000", "--repeat", "3"], ["--rows", "5000000"]),
    "delivery": (["-n", "10000", "--rounds", "1"], []),
    "apns_http2": (["--quick"], []),
    "device_import": (["-n", "50000"], []),
    "sandbox": (["-n", "30000", "--rounds", "1"], []),
    "chunk_dispatch": (
        [
            "--rounds",
            "1",
            "--chunks",
            "6",
            "--probes",
            "1",
            "--idle-seconds",
            "1",
            "--reference",
            "8",
            "--candidates",
            "inline",
        ],
        [],
    ),
    # these share one stack in quick mode; api_creates last: it leaves scheduled runs
    "punctuality": (["--scheduled", "8", "--now", "2", "--lead", "3"], []),
    "sandbox_end_to_end": (["--users", "10000", "--rounds", "1"], []),
    "worker_memory": (["--sizes", "5000", "25000"], []),
    "chunk_overhead": (["--chunks", "4", "--rounds", "1"], []),
    "chunk_interleaved": (["--chunks", "4", "--rounds", "1"], []),
    "chunk_task_cost": (["--runs", "100"], []),
    "request_rate": (["--rates", "5", "--seconds", "5", "--reference-runs", "8"], []),
    "million": (["--users", "20000"], []),
    "gigabyte": (["--bytes", "2000000", "--reference-users", "10000"], []),
    "api_creates": (["--rates", "10", "25", "--seconds", "4", "--workers", "1"], []),
    "startup": (["--rounds", "1"], []),
}
SHARED = (
    "punctuality",
    "sandbox_end_to_end",
    "worker_memory",
    "chunk_overhead",
    "chunk_interleaved",
    "chunk_task_cost",
    "request_rate",
    "million",
    "gigabyte",
    "api_creates",
)
SETUP_NOTE = "(set-up: Prefect server, database, deployments; CPU: its server's throughout)"


@dataclass(frozen=True)
class Result:
    """One ``RESULT`` line, its fields."""

    benchmark: str
    measure: str
    figure: str
    reference: str
    ratio: str
    target: str
    verdict: str


def parse_result(line: str) -> Result | None:
    """The fields of a ``RESULT | ...`` line (as ``harness.result`` prints it), else None."""
    fields = line.rstrip("\n").split(SEPARATOR)
    if len(fields) != 7 or fields[0] != RESULT_PREFIX:
        return None
    name, colon, measure = fields[1].partition(": ")
    values = []
    for text, key in zip(fields[2:6], ("figure", "reference", "ratio", "target"), strict=True):
        if not text.startswith(f"{key} "):
            return None
        values.append(text.removeprefix(f"{key} "))
    if not colon:
        return None
    return Result(name, measure, *values, fields[6])


@dataclass
class Ran:
    """One benchmark's run: its arguments, load average at start, time, status, results."""

    name: str
    arguments: list[str]
    load: float
    seconds: float = 0.0
    cpu: float = 0.0  # CPU seconds of the benchmark and every process it waited for
    status: int = 0
    results: list[Result] = field(default_factory=list)
    note: str = "(no RESULT line)"


def children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants so far (their children too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(name: str, arguments: list[str], env: dict[str, str]) -> Ran:
    """Run one benchmark, echoing its output line by line and keeping its RESULT lines."""
    ran = Ran(name, arguments, os.getloadavg()[0])
    print(f"\n=== {name} {' '.join(arguments)} (load average {ran.load:.1f})", flush=True)
    begun, cpu = time.monotonic(), children_cpu()
    with subprocess.Popen(
        [sys.executable, "-u", str(HERE / f"{name}.py"), *arguments],
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        env=env,
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            parsed = parse_result(line)
            if parsed is not None:
                ran.results.append(parsed)
    ran.status = child.returncode
    ran.seconds, ran.cpu = time.monotonic() - begun, children_cpu() - cpu
    return ran


def outcome(ran: Ran) -> str:
    return "ok" if ran.status == 0 else f"FAILED (exit {ran.status})"


def summary_text(runs: list[Ran], mode: str, total: float) -> str:
    verdict = ""
    if mode == "quick":
        verdict = (
            f" (target <= {QUICK_SECONDS} s: {'met' if total <= QUICK_SECONDS else 'NOT met'})"
        )
    lines = [
        f"=== {mode} run, {total:.0f} s{verdict}, {os.cpu_count()} CPUs, load average "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min) at the end:"
    ]
    for ran in runs:
        lines.append(
            f"  {ran.name:20s} {ran.seconds:5.0f} s  CPU {ran.cpu:5.0f} s  {outcome(ran):16s} "
            f"(load average {ran.load:.1f} at start)"
        )
        for found in ran.results:
            lines.append(
                f"      {found.measure}: {found.figure} | reference {found.reference} | "
                f"ratio {found.ratio} | target {found.target} | {found.verdict}"
            )
        if not ran.results:
            lines.append(f"      {ran.note}")
    return "\n".join(lines)


def summary_markdown(runs: list[Ran], mode: str, total: float) -> str:
    cpu = sum(ran.cpu for ran in runs)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"`make bench` ({mode}), {started}, {os.cpu_count()} CPUs, total {total:.0f} s; "
        "load average (1 min) at each benchmark's start in its row, "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min) at the end.",
        "",
        "| benchmark | s | CPU s | exit | measure | figure | reference | ratio | target "
        "| verdict |",
        "|---|---:|---:|---|---|---|---|---:|---|---|",
    ]
    for ran in runs:
        head = (
            f"| `{ran.name}` (load {ran.load:.1f}) | {ran.seconds:.0f} | {ran.cpu:.0f} "
            f"| {outcome(ran)} "
        )
        if not ran.results:
            lines.append(f"{head}| {ran.note} | | | | | |")
        for n, found in enumerate(ran.results):
            lead = head if n == 0 else "| | | | "
            lines.append(
                f"{lead}| {found.measure} | {found.figure} | {found.reference} | "
                f"{found.ratio} | {found.target} | {found.verdict} |"
            )
    if mode == "quick":
        verdict = "met" if total <= QUICK_SECONDS else "NOT met"
        lines.append(
            f"| **total** | **{total:.0f}** | {cpu:.0f} | | | | | | ≤ {QUICK_SECONDS} s "
            f"| {verdict} |"
        )
    else:
        lines.append(f"| **total** | **{total:.0f}** | {cpu:.0f} | | | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="each benchmark's full sizes")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--markdown", type=Path, help="also write the summary table here")
    args = parser.parse_args()
    mode = "full" if args.full else "quick"
    if set(args.only) != set(BENCHMARKS):  # the 5-minute target is the whole quick run's
        mode += f", only {' '.join(args.only)}"
    started = time.monotonic()
    runs: list[Ran] = []
    own = dict(os.environ)  # private_stack below changes this process's environment
    shared: dict[str, str] | None = None
    setup: Ran | None = None
    cpu_before = children_cpu()
    with ExitStack() as stack:
        for name in [name for name in BENCHMARKS if name in args.only]:
            quick, full = BENCHMARKS[name]
            if args.full or name not in SHARED:
                runs.append(run(name, full if args.full else quick, own))
                continue
            if shared is None:
                setup = Ran("shared stack", [], os.getloadavg()[0], note=SETUP_NOTE)
                print(f"\n=== shared stack for {', '.join(SHARED)}", flush=True)
                begun, own_cpu = time.monotonic(), time.process_time()
                home = stack.enter_context(private_stack())
                setup.seconds = time.monotonic() - begun
                setup.cpu = time.process_time() - own_cpu  # migrations, deployments
                shared = {**os.environ, SHARED_STACK: str(home)}
                runs.append(setup)
            runs.append(run(name, quick, shared))
    total = time.monotonic() - started
    if setup is not None:  # its Prefect server's CPU, counted once it has been waited for
        setup.cpu += children_cpu() - cpu_before - sum(r.cpu for r in runs if r is not setup)
    print("\n" + summary_text(runs, mode, total), flush=True)
    if args.markdown:
        args.markdown.write_text(summary_markdown(runs, mode, total))
        print(f"(markdown table in {args.markdown})")
    return 1 if any(ran.status for ran in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
