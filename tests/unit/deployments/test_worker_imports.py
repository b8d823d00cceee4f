"""What a worker process loads as it starts: a supervisor restarts a dead worker, and
every second of its imports delays the takeover of nothing but its own slots."""

from __future__ import annotations

from campaign_trigger import heap
from support import probe_output

PROBE = """
import sys
import campaign_trigger.deployments.worker
print("worker", "pandas" in sys.modules, "pandera" in sys.modules)
import campaign_trigger.api.app
print("api", "pandas" in sys.modules, "pandera" in sys.modules)
"""


def test_a_worker_loads_no_pandas_and_the_api_loads_it_as_it_starts() -> None:
    """pandas and pandera (3 of 12 s of a worker's import CPU on a slow machine) are not
    what its modules import: pandera loads when a file is ingested, pandas as the worker
    settles (below); the API, which ingests uploads, loads both before its first one."""
    assert probe_output(PROBE).split("\n")[:2] == ["worker False False", "api True True"]


FIRST_RENDER = """
import sys
import pyarrow as pa
from campaign_trigger.deployments.worker import settle_collector
from campaign_trigger.services.render import render_column
settle_collector()
before = set(sys.modules)
render_column("Hi {{ name }}, order {{ order }}", pa.table({"name": ["Ada"], "order": [1234]}))
print(sorted(set(sys.modules) - before))
"""


def test_a_settled_worker_renders_its_first_message_without_importing_anything() -> None:
    """pyarrow imports pandas at its first compute call (~1 s of CPU on a 2-core machine):
    a worker paid it in its first request, which reached its provider up to a second late;
    it now pays it as it starts, before it is ready."""
    assert probe_output(FIRST_RENDER).strip() == "[]"


THRESHOLD_OF_A_COMMAND = """
import gc, sys
from campaign_trigger.cli import main
sys.argv = ["campaign-trigger", "--help"]
try:
    main()
except SystemExit:
    pass
print(gc.get_threshold()[0])
"""


def test_a_command_imports_what_it_runs_with_the_collector_s_passes_rare() -> None:
    """``campaign-trigger`` sets the collector's thresholds before a command imports its
    server (``heap.starting``): a worker's or the API's start ~0.5 s of CPU shorter."""
    assert probe_output(THRESHOLD_OF_A_COMMAND).splitlines()[-1] == str(heap.YOUNG_PASS_EVERY)


UNCOMPILED = """
import importlib.util, os, sys, sysconfig
import campaign_trigger.deployments.prefect_server, campaign_trigger.deployments.worker
import campaign_trigger.api.app, prefect.server.api.server
site = sysconfig.get_paths()["purelib"]
for name, module in sorted(sys.modules.items()):
    source = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    if not (source.startswith(site) and source.endswith(".py")):
        continue
    cached = importlib.util.cache_from_source(source)
    header = open(cached, "rb").read(16) if os.path.exists(cached) else b""
    stat = os.stat(source)
    stamp = (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (
        stat.st_size & 0xFFFFFFFF
    ).to_bytes(4, "little")
    if header[8:16] != stamp:
        print(name)
"""


def test_the_servers_dependencies_load_compiled() -> None:
    """The locked dependencies are installed with their bytecode (``make``: ``uv pip sync
    --compile-bytecode``): where a process may not write it (``PYTHONDONTWRITEBYTECODE``,
    a read-only install), every start of a worker, the API or the Prefect server
    compiled Prefect, SQLAlchemy and pydantic from source, ~4 s of CPU each. Each module
    they load from site-packages has bytecode matching its source (Python's own check of a
    ``.pyc``: the source's modification time and size)."""
    assert probe_output(UNCOMPILED, PYTHONDONTWRITEBYTECODE="1").split() == []
