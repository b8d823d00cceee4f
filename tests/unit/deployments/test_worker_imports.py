"""What a worker process loads as it starts: a supervisor restarts a dead worker, and
every second of its imports delays the takeover of nothing but its own slots."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import campaign_trigger.deployments.worker
print("worker", "pandas" in sys.modules, "pandera" in sys.modules)
import campaign_trigger.api.app
print("api", "pandas" in sys.modules, "pandera" in sys.modules)
"""


def test_a_worker_loads_no_pandas_and_the_api_loads_it_as_it_starts() -> None:
    """pandas and pandera (3 of 12 s of a worker's import CPU on a slow machine) load when
    a file is ingested; the API, which ingests uploads, loads them before its first one."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split("\n")[:2] == ["worker False False", "api True True"]
