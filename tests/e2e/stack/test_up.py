"""`campaign-trigger up` on a fresh home: everything answers, the demo signs in, a killed
worker is started again and delivers, Ctrl-C leaves no process behind; a port in use
gives a clear message."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from support import ManagedProcess, free_port, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = str(Path(sys.executable).with_name("campaign-trigger"))


def _env(home: Path, ports: dict[str, int]) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("CT_", "PREFECT_"))
    }
    env.update(
        {
            "CT_HOME": str(home),
            "CT_API_PORT": str(ports["api"]),
            "CT_SANDBOX_PORT": str(ports["sandbox"]),
            "CT_SANDBOX_TLS_PORT": str(ports["sandbox_tls"]),
            "CT_PREFECT_PORT": str(ports["prefect"]),
        }
    )
    return env


def test_up_serves_the_stack_and_stops_cleanly(tmp_path: Path) -> None:
    ports = {k: free_port() for k in ("api", "sandbox", "sandbox_tls", "prefect")}
    home = tmp_path / "home"
    stack = ManagedProcess(
        "up", [CLI, "up"], env=_env(home, ports), log_dir=tmp_path, inherit_env=False
    )
    try:
        started = time.monotonic()
        wait_http(f"http://127.0.0.1:{ports['api']}/health", timeout=90, process=stack)
        assert time.monotonic() - started < 90
        health = httpx.get(f"http://127.0.0.1:{ports['api']}/health").json()
        assert health["database"] == "ok"
        _the_ui_that_opens_is_the_documented_one(ports["prefect"])
        assert httpx.get(f"http://127.0.0.1:{ports['sandbox']}/sandbox/stats").status_code == 200

        demo = json.loads((home / "demo.json").read_text())
        signed = httpx.post(
            f"http://127.0.0.1:{ports['api']}/users/sign_in",
            json={"user": {"email": demo["email"], "password": demo["password"]}},
        )
        assert signed.status_code == 200
        assert signed.headers["Authorization"].startswith("Bearer ")
        deadline = time.monotonic() + 30
        while "Press Ctrl-C" not in stack.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = stack.log_path.read_text()
        assert demo["password"] in log
        assert f":{ports['api']}" in log
        ca = home.resolve() / "sandbox-ca.pem"
        assert f"Sandbox CA    {ca}" in log
        trusting = ssl.create_default_context(cafile=str(ca))
        tls = httpx.get(f"https://127.0.0.1:{ports['sandbox_tls']}/sandbox/stats", verify=trusting)
        assert tls.status_code == 200

        _kill_the_worker_and_deliver_after_its_restart(stack, ports, signed.headers)

        group = [stack.pid, *(child.pid for child in psutil.Process(stack.pid).children(True))]
        assert len(group) >= 5
        os.kill(stack.pid, signal.SIGINT)
        stack.popen.wait(timeout=40)
        time.sleep(0.5)
        alive = [
            pid
            for pid in group
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
        assert alive == [], f"left behind: {alive}\n{stack.log_tail()}"
    finally:
        stack.stop()


def _the_ui_that_opens_is_the_documented_one(port: int) -> None:
    """A browser without a saved choice lands in the classic UI (docs/prefect-ui.md), not
    in Prefect's new one under /v2."""
    ui = f"http://127.0.0.1:{port}"
    landing = httpx.get(f"{ui}/", headers={"Accept": "text/html", "Sec-Fetch-Mode": "navigate"})
    assert landing.status_code == 200, (landing.status_code, landing.headers)
    assert "<html" in landing.text.lower()
    settings = httpx.get(f"{ui}/ui-settings").json()
    assert settings["default_ui"] == "v1", settings
    deployments = httpx.get(f"{ui}/deployments", headers={"Accept": "text/html"})
    assert deployments.status_code == 200
    assert "/v2" not in str(deployments.url)


def _kill_the_worker_and_deliver_after_its_restart(
    stack: ManagedProcess, ports: dict[str, int], signed: httpx.Headers
) -> None:
    [worker] = [
        child
        for child in psutil.Process(stack.pid).children(recursive=True)
        if "worker" in child.cmdline()
    ]
    worker.kill()
    deadline = time.monotonic() + 60
    while "delivery worker was started again" not in stack.log_path.read_text():
        assert time.monotonic() < deadline, stack.log_tail()
        time.sleep(0.2)
    api = f"http://127.0.0.1:{ports['api']}"
    auth = {"Authorization": signed["Authorization"]}
    created = httpx.post(
        f"{api}/api/campaigns/trigger",
        headers=auth,
        json={
            "campaign_id": "demo-campaign",
            "messages": [
                {"user_id": "user-1", "template_variables": {"first_name": "A", "order_id": "1"}}
            ],
        },
    )
    assert created.status_code == 200, created.text
    request_id = created.json()["request_id"]
    deadline = time.monotonic() + 120
    while True:
        report = httpx.get(
            f"{api}/api/campaigns/report", params={"request_id": request_id}, headers=auth
        )
        if report.status_code == 200:
            break
        assert time.monotonic() < deadline, (report.text, stack.log_tail())
        time.sleep(1)
    assert report.json()["reports"]


def test_up_names_a_port_in_use(tmp_path: Path) -> None:
    ports = {k: free_port() for k in ("api", "sandbox", "sandbox_tls", "prefect")}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", ports["api"]))
        busy.listen()
        stack = ManagedProcess(
            "up-busy",
            [CLI, "up", "--no-demo"],
            env=_env(tmp_path / "home", ports),
            log_dir=tmp_path,
            inherit_env=False,
        )
        code = stack.popen.wait(timeout=60)
    output = stack.log_path.read_text()
    assert code == 1
    assert f"Port {ports['api']} on 127.0.0.1 is already in use" in output
    assert "Traceback" not in output
