"""`campaign-trigger up` on a fresh home: everything answers, the demo signs in, Ctrl-C
leaves no process behind; a port in use gives a clear message."""

from __future__ import annotations

import json
import os
import signal
import socket
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
            "CT_PREFECT_PORT": str(ports["prefect"]),
        }
    )
    return env


def test_up_serves_the_stack_and_stops_cleanly(tmp_path: Path) -> None:
    ports = {"api": free_port(), "sandbox": free_port(), "prefect": free_port()}
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
        ui = httpx.get(f"http://127.0.0.1:{ports['prefect']}/", timeout=10)
        assert ui.status_code == 200
        assert "<html" in ui.text.lower()
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


def test_up_names_a_port_in_use(tmp_path: Path) -> None:
    ports = {"api": free_port(), "sandbox": free_port(), "prefect": free_port()}
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
