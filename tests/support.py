"""Helpers for tests that run real processes: free ports, readiness waits, process groups.

Importable from every test module (``pythonpath = ["tests"]``): ``from support import ...``.
"""

from __future__ import annotations

import os
import pty
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

import httpx

from campaign_trigger.stack import ephemeral_ports, port_free

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


_EPHEMERAL = ephemeral_ports()
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port nobody listens on now, never handed out before in this process.

    Not a port the kernel picks (``bind(0)``): those come from its ephemeral range, from
    which it also picks the source port of every outgoing connection, so between this call
    and the server's own bind any client of any process could take it (CI saw uvicorn fail
    with EADDRINUSE so). The ports from 20000 up outside that range (never the stack's
    4200/8000/8010/8443) are split between the suite's xdist processes, so two of them
    never hand out the same one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    candidates = [
        port
        for port in range(20000 + int(worker), 65536, count)
        if port not in _EPHEMERAL and port not in _HANDED_OUT
    ]
    random.shuffle(candidates)  # two suites side by side rarely start on the same port
    for port in candidates:
        if port_free("127.0.0.1", port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free TCP port outside the ephemeral range")


def until(
    condition: Callable[[], object], *, seconds: float = 5.0, what: str = "", every: float = 0.02
) -> None:
    """Poll ``condition`` every ``every`` seconds until it holds; fail with ``what`` after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what or "the condition never held"
        time.sleep(every)


def wait_http(url: str, *, timeout: float = 60.0, process: ManagedProcess | None = None) -> None:
    """Poll ``url`` until it answers 2xx; fail early if ``process`` died."""
    deadline = time.monotonic() + timeout
    last: str = ""
    with httpx.Client(timeout=2) as client:  # one TLS context (~40 ms of CPU each), not one a try
        while time.monotonic() < deadline:
            if process is not None and process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited early:\n{process.log_tail()}")
            try:
                response = client.get(url)
                if response.status_code < 300:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.2)
    tail = process.log_tail() if process else ""
    raise TimeoutError(f"{url} not ready after {timeout}s ({last})\n{tail}")


class ManagedProcess:
    """A child process in its own process group, logging to a file, killed as a group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path,
        cwd: Path | None = None,
        inherit_env: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**(os.environ if inherit_env else {}), **(env or {})}
        self.log_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self.cwd = cwd or REPO
        self.popen = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = self.log_path.open("ab")
        return subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_logged(self, text: str, *, timeout: float = 90.0) -> None:
        """Until ``text`` is in the log (a worker's " ready: polling": its deployments are
        registered); fail early if the process died."""
        deadline = time.monotonic() + timeout
        while text not in self.log_path.read_text(errors="replace"):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not log {text!r}:\n{self.log_tail()}")
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole group (frozen or not) and reap the leader."""
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
            os.killpg(self.popen.pid, signal.SIGCONT)  # a frozen group handles it
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)

    def freeze(self) -> None:
        """SIGSTOP the whole group: it keeps its state and does nothing until :meth:`thaw`."""
        os.killpg(self.popen.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.popen.pid, signal.SIGCONT)

    def freeze_when(self, holds: Callable[[int], bool], *, timeout: float = 5.0) -> None:
        """:meth:`freeze` at a moment where ``holds(pid)`` is true of the frozen process
        (tried again and again: frozen, looked at, thawed if not)."""
        deadline, tries = time.monotonic() + timeout, 0
        while True:
            self.freeze()
            while not _stopped(self.popen.pid):  # every thread: the lock is held or not
                time.sleep(0.0005)
            if holds(self.popen.pid):
                return
            self.thaw()
            tries += 1
            assert time.monotonic() < deadline, f"no such moment in {tries} tries ({timeout} s)"
            time.sleep(0.001)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
        self.kill(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.popen = self._spawn()


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that just ended
            stat = (task / "stat").read_text()
            if stat[stat.rindex(")") + 2] not in "tT":
                return False
    return True


def holds_sqlite_write_lock(pid: int, database: Path) -> bool:
    """Whether process ``pid`` holds the write lock of the SQLite database ``database``
    in WAL mode: a POSIX lock on byte 120 of its ``-shm`` file (``/proc/locks``)."""
    shm = os.stat(f"{database}-shm")
    file = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        # "1: POSIX  ADVISORY  WRITE 14700 fe:00:2187880 120 120" ("1: -> ..." waits)
        fields = line.split()
        if fields[1:5] == ["POSIX", "ADVISORY", "WRITE", str(pid)] and fields[5:7] == [
            file,
            "120",
        ]:
            return True
    return False


def prefect_server_argv(port: int) -> list[str]:
    """The Prefect server ``campaign-trigger up`` runs (SQLite transactions IMMEDIATE)."""
    return [
        str(VENV_BIN / "python"),
        "-m",
        "campaign_trigger.deployments.prefect_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def prefect_server_env(home: Path, port: int) -> dict[str, str]:
    """Environment for a Prefect server (and its clients) with its own SQLite database."""
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }


def probe_output(code: str, **env: str) -> str:
    """What ``code`` prints, run by this venv's Python in a process of its own (the
    environment this one's, with ``env`` on top); a failure raises with its output."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, **env},
    )
    return done.stdout


def run_on_terminal(argv: Sequence[str], *, timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin, stdout and stderr (a 100-column
    xterm); its exit code and everything it drew."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100"}
    process = subprocess.Popen(
        list(argv), stdin=secondary, stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    output = b""
    with suppress(OSError):  # EIO once the child has closed the terminal
        while chunk := os.read(primary, 65536):
            output += chunk
    os.close(primary)
    return process.wait(timeout=timeout), output.decode(errors="replace")
