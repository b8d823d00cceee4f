"""``campaign-trigger up``: the embedded stack on one machine, as child processes.

Order: migrate → seed the demo → Prefect server (unless PREFECT_API_URL names one; on
SQLite, with its transactions begun IMMEDIATE: ``deployments/prefect_server.py``)
→ sandbox providers → API → delivery worker → runner of the other deployments
(send-batch, the daily CSV example, maintenance). Each child runs in its own process
group and dies with us (PR_SET_PDEATHSIG); Ctrl-C or SIGTERM stops them all. A child
that dies once the stack is up is started again, after 1, 2, 4 … 30 s (reset once it
has stayed up a minute), and the terminal says so: one crashed worker does not take
the API down with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from campaign_trigger.config import Settings
from campaign_trigger.errors import CampaignTriggerError
from campaign_trigger.store.private import private_dir

_PR_SET_PDEATHSIG = 1


class StackError(CampaignTriggerError):
    """The stack cannot start (a port in use, a child that died)."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn`` of a child: its own session, and SIGTERM when its parent dies."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def ephemeral_ports() -> range:
    """The kernel's range for the source ports of outgoing connections: a port from it,
    free now, may be taken by any client before a server binds it."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):  # not Linux: IANA's dynamic range, which macOS uses
        return range(49152, 65536)


def port_free(host: str, port: int) -> bool:
    """Whether a server (``SO_REUSEADDR``, as uvicorn's) could bind ``host:port`` now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_port_free(host: str, port: int, what: str, setting: str) -> None:
    if not port_free(host, port):
        raise StackError(
            f"Port {port} on {host} is already in use, so the {what} cannot start: "
            f"stop whatever listens there, or set {setting} to another port."
        )


RESTART_BACKOFF_CAP = 30.0
STABLE_AFTER_SECONDS = 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    ready_url: str | None
    after: tuple[str, ...] = ()  # the children that must answer before this one starts
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    started_at: float = 0.0
    restarts: int = 0
    restart_at: float | None = None  # when a dead child is due to start again

    def start(self, *, log_dir: Path) -> None:
        self.started_at = time.monotonic()
        private_dir(log_dir)
        self.log_path = log_dir / f"{self.name}.log"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with suppress(ProcessLookupError):  # whatever the leader left behind in its group
            os.killpg(self.process.pid, signal.SIGKILL)


def wait_ready(child: Child, *, timeout: float, say: Callable[[str], None]) -> None:
    if child.ready_url is None:
        return
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not child.alive():
            raise StackError(f"The {child.name} exited while starting:\n{child.log_tail()}")
        try:
            if httpx.get(child.ready_url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > next_note:
            say(f"  … still waiting for the {child.name}")
            next_note = time.monotonic() + 5
        time.sleep(0.3)
    raise StackError(
        f"The {child.name} did not answer {child.ready_url} in {timeout:.0f}s:\n{child.log_tail()}"
    )


def prefect_env(settings: Settings) -> dict[str, str]:
    """Where the embedded Prefect server keeps its data, and how everyone reaches it."""
    home = (settings.home / "prefect").resolve()
    private_dir(home)
    api = f"http://127.0.0.1:{settings.prefect_port}/api"
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_UI_API_URL": api,
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # http://127.0.0.1:4200 opens the UI docs/prefect-ui.md describes and shows (the
        # classic one: the send-batch form field by field, Cancel in the run's menu), not
        # Prefect 3.8's new UI under /v2, whose run form is one JSON editor.
        "PREFECT_SERVER_UI_V2_ENABLED": "false",
    }


def api_processes(settings: Settings, cpus: int | None) -> int:
    """How many API processes ``up`` runs: ``CT_API_WORKERS`` when set, else one per
    four cores. On one machine the Prefect server (~190 ms of CPU per one-message
    request) and the delivery worker need the cores far more than the API (~25 ms per
    create): a second API process on 2 cores made creates slower (docs/benchmarks.md)."""
    if "api_workers" in settings.model_fields_set:
        return settings.api_workers
    return max(1, (cpus or 1) // 4)


def plan(settings: Settings) -> tuple[list[Child], dict[str, str]]:
    """The children to start, in order, and the environment they share. The sandbox and
    the API start beside the Prefect server (the API keeps what it accepts in its outbox
    until Prefect answers); the worker and the runner once the server answers."""
    exe = [sys.executable, "-m", "campaign_trigger.cli"]
    external = os.environ.get("PREFECT_API_URL")
    shared: dict[str, str] = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    children: list[Child] = []
    prefect: tuple[str, ...] = ()  # the Prefect server to wait for: none when external
    if external:
        shared["PREFECT_API_URL"] = external
    else:
        check_port_free("127.0.0.1", settings.prefect_port, "Prefect server", "CT_PREFECT_PORT")
        shared.update(prefect_env(settings))
        children.append(
            Child(
                "Prefect server",
                [
                    sys.executable,
                    "-m",
                    "campaign_trigger.deployments.prefect_server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(settings.prefect_port),
                ],
                f"http://127.0.0.1:{settings.prefect_port}/api/health",
            )
        )
        prefect = ("Prefect server",)
    check_port_free(
        settings.sandbox_host, settings.sandbox_port, "sandbox provider", "CT_SANDBOX_PORT"
    )
    check_port_free(
        settings.sandbox_host,
        settings.sandbox_tls_port,
        "sandbox provider (TLS)",
        "CT_SANDBOX_TLS_PORT",
    )
    check_port_free(settings.api_host, settings.api_port, "API", "CT_API_PORT")
    children += [
        Child(
            "sandbox provider",
            [*exe, "sandbox"],
            f"http://{settings.sandbox_host}:{settings.sandbox_port}/sandbox/stats",
        ),
        Child(
            "API",
            [*exe, "api", "--workers", str(api_processes(settings, os.cpu_count()))],
            f"http://{settings.api_host}:{settings.api_port}/health",
        ),
        Child("delivery worker", [*exe, "worker"], None, after=prefect),
        Child("deployment runner", [*exe, "runner"], None, after=prefect),
    ]
    return children, shared


def _supervise(child: Child, *, log_dir: Path, say: Callable[[str], None]) -> None:
    """Start a dead child again, after a backoff that grows while it keeps dying."""
    now = time.monotonic()
    if child.alive():
        if child.restarts and now - child.started_at > STABLE_AFTER_SECONDS:
            child.restarts = 0  # it held: the next death starts the backoff afresh
        return
    if child.restart_at is None:
        delay = min(RESTART_BACKOFF_CAP, 2.0**child.restarts)
        code = child.process.returncode if child.process is not None else None
        say(
            f"The {child.name} stopped (exit code {code}); starting it again in "
            f"{delay:.0f} s. Its last lines:\n{child.log_tail()}"
        )
        child.restart_at = now + delay
        return
    if now >= child.restart_at:
        child.restart_at = None
        child.restarts += 1
        child.start(log_dir=log_dir)
        say(f"The {child.name} was started again (restart {child.restarts}).")


def run(
    children: list[Child],
    shared_env: dict[str, str],
    *,
    log_dir: Path,
    say: Callable[[str], None],
    on_ready: Callable[[], None],
) -> int:
    """Start the children (those that come after no other first, then each once those it
    comes after answer), then watch them (restarting any that dies) until a signal; stop
    them all."""
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    os.environ.update(shared_env)
    try:
        by_name = {child.name: child for child in children}
        answered: set[str] = set()

        def answering(child: Child) -> None:
            if child.name not in answered:
                wait_ready(child, timeout=120, say=say)
                answered.add(child.name)

        # Those that wait for none first, each group in the plan's order (a stable sort).
        for child in sorted(children, key=lambda child: bool(child.after)):
            for name in child.after:
                answering(by_name[name])
            if stopping:
                return 130
            say(f"Starting the {child.name} …")
            child.start(log_dir=log_dir)
        for child in children:
            answering(child)
        on_ready()
        while not stopping:
            for child in children:
                _supervise(child, log_dir=log_dir, say=say)
            time.sleep(0.5)
        return 0
    finally:
        say("Stopping …")
        for child in reversed(children):
            child.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("Stopped.")
