"""What ``up`` starts, and in what order: how many API processes it picks; the sandbox and
the API start beside the Prefect server, the worker and the runner once it answers."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from campaign_trigger import stack
from campaign_trigger.config import Settings
from campaign_trigger.stack import Child, api_processes
from support import free_port


@pytest.mark.parametrize(("cpus", "expected"), [(None, 1), (1, 1), (2, 1), (7, 1), (8, 2), (16, 4)])
def test_up_runs_one_api_process_per_four_cores(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, expected: int
) -> None:
    monkeypatch.delenv("CT_API_WORKERS", raising=False)
    assert api_processes(Settings(), cpus) == expected


def test_ct_api_workers_wins_over_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CT_API_WORKERS", "1")
    assert api_processes(Settings(), 16) == 1
    monkeypatch.setenv("CT_API_WORKERS", "3")
    assert api_processes(Settings(), 2) == 3


def _settings(home: Path) -> Settings:
    return Settings(
        home=home,
        api_port=free_port(),
        sandbox_port=free_port(),
        sandbox_tls_port=free_port(),
        prefect_port=free_port(),
    )


@pytest.mark.parametrize("external", [False, True])
def test_only_the_worker_and_the_runner_wait_for_the_prefect_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, external: bool
) -> None:
    if external:
        monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")
    else:
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
    children, _ = stack.plan(_settings(tmp_path))
    after = {child.name: child.after for child in children}
    server = () if external else ("Prefect server",)
    assert after == {
        **({} if external else {"Prefect server": ()}),
        "sandbox provider": (),
        "API": (),
        "delivery worker": server,
        "deployment runner": server,
    }


def _stamping(stamp: Path) -> list[str]:
    """A child that writes the time it started to ``stamp``, then waits."""
    code = f"import time; open({str(stamp)!r}, 'w').write(repr(time.time())); time.sleep(60)"
    return [sys.executable, "-c", code]


def test_a_child_starts_once_those_it_comes_after_answer_the_others_at_once(
    tmp_path: Path,
) -> None:
    """The slow server answers 1.5 s after it starts: the child that comes after it starts
    after that, the one that does not before it."""
    port = free_port()
    answers, after, beside = (tmp_path / n for n in ("answers", "after", "beside"))
    serve = (
        f"import time; time.sleep(1.5); open({str(answers)!r}, 'w').write(repr(time.time())); "
        "import http.server as h; "
        f"h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    )
    server = Child("server", [sys.executable, "-c", serve], f"http://127.0.0.1:{port}/")
    children = [
        server,
        Child("after", _stamping(after), None, after=("server",)),
        Child("beside", _stamping(beside), None),
    ]
    said: list[str] = []

    def stop_once_stamped() -> None:
        deadline = time.monotonic() + 20
        while not (after.exists() and beside.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    code = stack.run(
        children, {}, log_dir=tmp_path / "logs", say=said.append, on_ready=stop_once_stamped
    )
    assert code == 0
    assert said[:3] == ["Starting the server …", "Starting the beside …", "Starting the after …"]
    stamps = {path.name: float(path.read_text()) for path in (answers, after, beside)}
    assert stamps["beside"] < stamps["answers"] < stamps["after"], stamps
    assert all(not child.alive() for child in children)
