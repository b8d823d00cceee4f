"""The embedded stack's start: ``campaign-trigger up`` on a fresh home until every process
is ready, with the dependencies loaded from the bytecode ``make`` installs, against the
same start compiling them from source.

Each round starts ``up`` with a new home on free ports and waits until it prints its
banner (the Prefect server, the sandbox and the API answer), the delivery worker logs
``ready: polling`` and the deployment runner ``serving``; then reads the wall time since
the start and the CPU the whole process tree used (``up`` and its children, user and
system: :func:`harness.tree_cpu`), and stops it with Ctrl-C.

The reference, in the same run, in turns with it (the first round's order alternating):
the same start where the installed bytecode cannot be read nor written
(``PYTHONPYCACHEPREFIX`` an empty folder, ``PYTHONDONTWRITEBYTECODE=1``), as every start
was before the dependencies were installed compiled in an environment that forbids
writing bytecode (this machine's, many containers', a read-only install). With a venv
installed without bytecode where it may be written, only the first start pays it.

Usage: ``.venv/bin/python bench/startup.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness import free_port, result, tree_cpu

CLI = str(Path(sys.executable).with_name("campaign-trigger"))
READY = {"delivery worker.log": "ready: polling", "deployment runner.log": "serving "}


@dataclass
class Start:
    wall: float  # seconds from the command to every process ready
    cpu: float  # CPU seconds of the whole tree by then


def one_start(*, from_source: bool, timeout: float = 300) -> Start:
    with tempfile.TemporaryDirectory(prefix="ct-startup-") as folder:
        home = Path(folder) / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CT_", "PREFECT_"))}
        env.update(
            CT_HOME=str(home),
            CT_API_PORT=str(free_port()),
            CT_PREFECT_PORT=str(free_port()),
            CT_SANDBOX_PORT=str(free_port()),
            CT_SANDBOX_TLS_PORT=str(free_port()),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )
        if from_source:
            empty = Path(folder) / "no-bytecode"
            empty.mkdir()
            env.update(PYTHONPYCACHEPREFIX=str(empty), PYTHONDONTWRITEBYTECODE="1")
        output = Path(folder) / "up.log"
        started = time.monotonic()
        with output.open("wb") as sink:
            up = subprocess.Popen([CLI, "up"], env=env, stdout=sink, stderr=subprocess.STDOUT)
        tree = psutil.Process(up.pid)
        try:
            while not _ready(output, home / "logs"):
                if up.poll() is not None or time.monotonic() - started > timeout:
                    raise RuntimeError(f"up did not get ready:\n{output.read_text()[-3000:]}")
                time.sleep(0.05)
            wall = time.monotonic() - started
            return Start(wall=wall, cpu=tree_cpu(tree))
        finally:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for process in [tree, *tree.children(recursive=True)]:
                    process.kill()
                up.wait()


def _ready(output: Path, logs: Path) -> bool:
    if b"Press Ctrl-C" not in output.read_bytes():
        return False
    for name, marker in READY.items():
        log = logs / name
        if not log.exists() or marker not in log.read_text(errors="replace"):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    compiled: list[Start] = []
    source: list[Start] = []
    for round_no in range(args.rounds):
        order = (False, True) if round_no % 2 == 0 else (True, False)
        for from_source in order:
            start = one_start(from_source=from_source)
            (source if from_source else compiled).append(start)
            print(
                f"round {round_no + 1}, {'from source' if from_source else 'compiled'}: "
                f"every process ready in {start.wall:.1f} s, {start.cpu:.1f} s of CPU",
                flush=True,
            )
    wall = statistics.median(s.wall for s in compiled)
    cpu = statistics.median(s.cpu for s in compiled)
    ref_wall = statistics.median(s.wall for s in source)
    ref_cpu = statistics.median(s.cpu for s in source)
    result(
        "startup",
        f"up on a fresh home until every process is ready, median of {args.rounds}",
        figure=f"{wall:.1f} s, {cpu:.1f} s of CPU",
        reference=f"{ref_wall:.1f} s, {ref_cpu:.1f} s of CPU (the same start compiling them)",
        ratio=cpu / ref_cpu,
        target="the CPU below the reference's",
        met=cpu < ref_cpu,
        why="the ratio is of the CPU",
    )


if __name__ == "__main__":
    main()
