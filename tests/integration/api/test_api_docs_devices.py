"""docs/devices-and-inbox.md works as written: its shell blocks, run in order by bash
against a real API server (and the real admin CLI), register a device, log a user in
with an identity hash, are refused without one, and read the inbox."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from api_tenants import start_api_server

from support import REPO, VENV_BIN

DOC = REPO / "docs" / "devices-and-inbox.md"


def test_the_sdk_flow_of_the_docs_runs_as_written(session_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "CT_HOME": str(home)}
    cli = str(VENV_BIN / "campaign-trigger")
    subprocess.run([cli, "admin", "create-org", "demo"], env=env, check=True, timeout=120)
    server = start_api_server(session_dir, CT_HOME=str(home))
    try:
        blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
        script = "set -euo pipefail\n" + "\n".join(blocks)
        done = subprocess.run(
            ["bash", "-c", script],
            env={**env, "API": server.url, "CT": cli},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        server.process.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '"device_secret":"ds_' in out
    assert '"user_id":"user-1","logged_in":true' in out
    assert re.search(r"(^|[}\n])401\n", out), out
    assert '{"messages":[],"next_cursor":null}' in out
    assert '"opted_in":false' in out
    assert '"uninstalled":true' in out
    assert not (tmp_path / "registered.json").exists()
