"""What ``up`` starts, and in what order: how many API processes it picks; the sandbox and
the API start beside the Prefect server, the worker and the runner once it answers; a
child that dies is started again after a backoff."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

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


def test_a_child_that_keeps_dying_is_restarted_ever_later_and_afresh_once_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each death is said with the child's exit code and its last lines; the backoff
    doubles from 1 s up to ``RESTART_BACKOFF_CAP``, and a child that then ran for
    ``STABLE_AFTER_SECONDS`` starts from 1 s again when it next dies. On a clock of the
    test's (the children are real processes)."""
    now = [1000.0]
    monkeypatch.setattr("campaign_trigger.stack.time", SimpleNamespace(monotonic=lambda: now[0]))
    said: list[str] = []
    logs = tmp_path / "logs"
    dying = [sys.executable, "-c", "print('out of memory'); raise SystemExit(3)"]
    child = Child("delivery worker", dying, None)

    def delay_of_next_restart() -> float:
        assert child.process is not None
        child.process.wait(timeout=30)
        stack._supervise(child, log_dir=logs, say=said.append)  # notices the death
        assert child.restart_at is not None
        delay = child.restart_at - now[0]
        now[0] = child.restart_at - 0.01
        stack._supervise(child, log_dir=logs, say=said.append)
        assert not child.alive()  # not before its time
        now[0] = child.restart_at
        stack._supervise(child, log_dir=logs, say=said.append)
        assert child.restart_at is None
        return delay

    child.start(log_dir=logs)
    try:
        delays = [delay_of_next_restart() for _ in range(7)]
        assert delays == [1, 2, 4, 8, 16, stack.RESTART_BACKOFF_CAP, stack.RESTART_BACKOFF_CAP]
        assert said[0].startswith(
            "The delivery worker stopped (exit code 3); starting it again in 1 s. Its last lines:"
        )
        assert "out of memory" in said[0]
        assert said[1] == "The delivery worker was started again (restart 1)."
        assert said[-1] == "The delivery worker was started again (restart 7)."

        # It holds now: past STABLE_AFTER_SECONDS alive, its next death is 1 s away again.
        child.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        delay_of_next_restart()
        assert child.alive()
        now[0] += stack.STABLE_AFTER_SECONDS - 1
        stack._supervise(child, log_dir=logs, say=said.append)
        assert child.restarts == 8  # not yet
        now[0] += 2
        stack._supervise(child, log_dir=logs, say=said.append)
        assert child.restarts == 0
        child.argv = dying
        child.stop()
        assert delay_of_next_restart() == 1
    finally:
        child.stop()
