"""A CSV upload through the Python client draws a progress bar of the bytes sent when run on
a terminal, and draws nothing when its output is not one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from api_tenants import Server, Tenant

from support import run_on_terminal

UPLOAD = """
import sys
from campaign_trigger.client import TriggerClient

url, token, campaign, path = sys.argv[1:]
with TriggerClient(url, token=token) as client:
    print("created", client.create(campaign, csv_path=path).request_id)
"""


def test_a_csv_upload_draws_a_bar_on_a_terminal_only(
    api_server: Server, tenant: Tenant, tmp_path: Path
) -> None:
    path = tmp_path / "batch.csv"
    path.write_text("User\n" + "".join(f"user-{n}\n" for n in range(200_000)))
    argv = [sys.executable, "-c", UPLOAD, api_server.url, tenant.auth()["Authorization"]]
    argv += [tenant.plain, str(path)]

    code, drawn = run_on_terminal(argv)

    assert code == 0, drawn
    assert "Uploading batch.csv" in drawn
    assert "created " in drawn
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    assert piped.stdout.startswith("created ")
    assert piped.stderr == ""
