"""What the end-to-end benchmarks share: a private stack, a bare responder, an audience.

* :func:`private_stack`: a temporary ``CT_HOME``, a migrated SQLite database and a
  Prefect server (SQLite) on free ports, with our deployments registered; the
  environment of this process points at them (child processes inherit it).
* :func:`nginx_responder`: Debian's nginx, configured here, answering FCM's success
  body on ``/v1/...`` and an OAuth token on ``/token`` over HTTP/1.1 — the fastest
  provider stand-in this machine has, so the figures measure us, not the sandbox.
* :func:`seed_audience`, :func:`create_csv_request`: users with one Android device each,
  and a CSV request of them through the service the API calls.
* :class:`Worker`: a ``campaign-trigger worker`` process whose RSS is sampled.
* :func:`pin_apart`: this process and what it starts next on one CPU, the stack's
  Prefect server and nginx on the others.
* :func:`result`: the one ``RESULT | ...`` line every benchmark prints per target it
  measures (figure, same-run reference, ratio, target, verdict); ``run_all.py`` collects
  them into its summary.
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil

from campaign_trigger.stack import die_with_parent, ephemeral_ports, port_free

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

BIN = Path(sys.executable).parent
FCM_SUCCESS = '{"name": "projects/bench/messages/0:1"}'
TOKEN_ANSWER = '{"access_token": "ya29.bench", "expires_in": 3599, "token_type": "Bearer"}'


RESULT_PREFIX = "RESULT"
SEPARATOR = " | "


def result(
    benchmark: str,
    measure: str,
    *,
    figure: str,
    reference: str,
    ratio: float | None,
    target: str,
    met: bool | None,
    why: str = "",
) -> str:
    """Print (and return) the benchmark's line for one target, in the shared format::

        RESULT | <benchmark>: <measure> | figure <figure> | reference <reference>
        | ratio <ratio> | target <target> | met|NOT met|no verdict (<why>)

    ``figure`` and ``reference`` carry their units (the reference says what it is);
    ``ratio`` is figure / reference (``None``: not a ratio of like quantities);
    ``met`` is the verdict computed from the figures, ``None`` when this run cannot
    decide it (``why`` then says why, e.g. a quick size); ``why`` may qualify any verdict.
    """
    verdict = "no verdict" if met is None else "met" if met else "NOT met"
    if why:
        verdict += f" ({why})"
    elif met is None:
        raise ValueError("no verdict needs a reason")
    fields = [
        RESULT_PREFIX,
        f"{benchmark}: {measure}",
        f"figure {figure}",
        f"reference {reference}",
        f"ratio {'n/a' if ratio is None else f'{ratio:.2f}'}",
        f"target {target}",
        verdict,
    ]
    if any("|" in field for field in fields):
        raise ValueError(f"'|' separates the fields of a RESULT line: {fields}")
    line = SEPARATOR.join(fields)
    print(line, flush=True)
    return line


def knee_verdict(held: dict[float, bool], target: float) -> bool | None:
    """Whether a rate of at least ``target`` holds, from the rates tried (rate -> held).

    Met when a rate >= target held; not met when a rate <= target did not hold (a
    higher one would not either); undecided otherwise: every rate tried below it held,
    and none at or above it did (none tried, or those tried failed).
    """
    if any(ok for rate, ok in held.items() if rate >= target):
        return True
    if any(not ok for rate, ok in held.items() if rate <= target):
        return False
    return None


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nobody listens on and not handed out before, outside the kernel's ephemeral
    range: a port ``bind(0)`` hands out can be taken as an outgoing connection's source
    port before our server binds it (tests/support.py says more)."""
    ephemeral = ephemeral_ports()
    for port in random.sample(range(20000, 65536), 65536 - 20000):
        if port not in ephemeral and port not in _HANDED_OUT and port_free("127.0.0.1", port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free TCP port outside the ephemeral range")


def wait_http(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 300:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def report_links(
    api: str, headers: dict[str, str], request_id: str, *, timeout: float
) -> list[str]:
    """The request's report links, polled every 0.1 s until they answer; TimeoutError
    with the last answer after ``timeout`` seconds (a request that failed, or a worker
    that died, fails the benchmark instead of hanging it).

    One client for every poll: ``httpx.get`` builds a client (and its TLS context) per
    call, ~26 ms of CPU, so polling with it took a fifth of a core from the stack being
    measured; a kept connection costs ~0.5 ms a poll.
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(headers=headers, timeout=30) as client:
        while True:
            answer = client.get(f"{api}/api/campaigns/report", params={"request_id": request_id})
            if answer.status_code == 200:
                links: list[str] = answer.json()["reports"]
                return links
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no report for {request_id} after {timeout:.0f} s: "
                    f"{answer.status_code} {answer.text}"
                )
            time.sleep(0.1)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


POSTGRES = "postgresql://postgres@127.0.0.1:5432"


@contextmanager
def postgres_database() -> Iterator[str]:
    """A throwaway database on the local PostgreSQL server; its name."""
    name = f"ct_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", POSTGRES, "-qc", f'CREATE DATABASE "{name}"'], check=True)
    try:
        yield name
    finally:
        subprocess.run(
            ["psql", POSTGRES, "-qc", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'],
            check=False,
        )


SHARED_STACK = "BENCH_SHARED_STACK"  # the home of a stack this environment already names
PREFECT_PID = "BENCH_PREFECT_PID"  # the pid of the stack's Prefect server


@contextmanager
def private_stack(*, postgres: bool = False, **settings: str) -> Iterator[Path]:
    """A temporary home with a migrated database and a Prefect server; yields the home.

    With ``postgres``, the Prefect server and the service each get a PostgreSQL
    database of their own (DESIGN §7's set-up), else SQLite files in the home. When
    ``BENCH_SHARED_STACK`` names a running stack (``run_all.py`` in quick mode starts one
    for the benchmarks that would each start the same), a plain request yields its home.
    """
    shared = os.environ.get(SHARED_STACK)
    if shared and not postgres and not settings:
        yield Path(shared)
        return
    home = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    port = free_port()
    with ExitStack() as databases:
        if postgres:
            prefect_db = databases.enter_context(postgres_database())
            service_db = databases.enter_context(postgres_database())
            settings = {
                "PREFECT_API_DATABASE_CONNECTION_URL": (
                    f"postgresql+asyncpg://postgres@127.0.0.1:5432/{prefect_db}"
                ),
                "CT_DATABASE_URL": f"{POSTGRES}/{service_db}",
                **settings,
            }
        with _stack_in(home, port, settings):
            yield home


@contextmanager
def _stack_in(home: Path, port: int, settings: dict[str, str]) -> Iterator[None]:
    os.environ.update(
        {
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            "CT_HOME": str(home / "ct"),
            "CT_SECRET_KEY": uuid.uuid4().hex * 2,
            **settings,
        }
    )
    from campaign_trigger.config import get_settings

    get_settings.cache_clear()
    log = (home / "prefect-server.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "campaign_trigger.deployments.prefect_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    os.environ[PREFECT_PID] = str(server.pid)
    try:
        from campaign_trigger.deployments.register import ensure_deployments
        from campaign_trigger.store.migrate import upgrade

        upgrade(get_settings().database_url)
        wait_http(f"http://127.0.0.1:{port}/api/health")
        asyncio.run(ensure_deployments())
        yield
    finally:
        stop_process(server)
        shutil.rmtree(home, ignore_errors=True)


def start_nginx(folder: Path) -> subprocess.Popen[bytes]:
    """Debian's nginx on ``folder/nginx.conf`` (which says ``daemon off``), in its own
    session, ended with this process."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return subprocess.Popen(
        [nginx, "-c", str(folder / "nginx.conf"), "-p", str(folder), "-e", str(folder / "e.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )


@contextmanager
def nginx_responder() -> Iterator[str]:
    """nginx answering FCM sends and token requests; yields its base URL."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise SystemExit("nginx is needed: apt-get install -y nginx-light")
    folder = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    port = free_port()
    (folder / "nginx.conf").write_text(
        f"""
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {folder}/body;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        default_type application/json;
        location = /token {{ return 200 '{TOKEN_ANSWER}'; }}
        location / {{ return 200 '{FCM_SUCCESS}'; }}
    }}
}}
"""
    )
    process = start_nginx(folder)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/token", timeout=10)
        yield url
    finally:
        stop_process(process)
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Audience:
    org_id: int
    campaign_id: str
    users: list[str]


def token_of(user: str) -> str:
    """The push token :func:`seed_audience` gives ``user-<n>``'s device: APNs' form (64
    hex digits of n); FCM takes any."""
    return f"{int(user.removeprefix('user-')):064x}"


def seed_audience(count: int, *, batch: int = 50_000, platform: str = "android") -> Audience:
    """An organisation, an app (Android unless ``platform`` says ``ios``), a started
    campaign and ``count`` users with one device each."""
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import (
        App,
        Campaign,
        CampaignApp,
        CampaignState,
        Channel,
        Device,
        Organisation,
        Platform,
    )

    tag = uuid.uuid4().hex[:8]
    with session_scope() as session:
        org = Organisation(name=f"bench-{tag}", request_quota=10**9)
        session.add(org)
        session.flush()
        assert org.id is not None
        app = App(app_id=f"bench-{tag}", org_id=org.id, platform=Platform(platform), sdk_key=tag)
        campaign = Campaign(
            org_id=org.id,
            channel=Channel.push,
            state=CampaignState.started,
            title="Hello {{ first_name }}",
            body="Order {{ order_id }} has shipped",
            variables=["first_name", "order_id"],
        )
        session.add_all([app, campaign])
        session.flush()
        session.add(CampaignApp(campaign_id=campaign.id, app_id=app.app_id))
        org_id, campaign_id, app_id = org.id, campaign.id, app.app_id
    users = [f"user-{n:08d}" for n in range(count)]
    with session_scope() as session:
        dialect = session.get_bind().dialect
    # Plain tuples through the driver, the timestamp bound once as the ORM binds it: the
    # gigabyte's 26 M devices took ~30 µs a row as ORM dicts.
    updated_at = Device.__table__.c.updated_at.type  # type: ignore[attr-defined]
    bind = updated_at.dialect_impl(dialect).bind_processor(dialect)
    stamp = bind(datetime.now(UTC)) if bind else datetime.now(UTC)
    statement = (
        "INSERT INTO device (app_id, device_id, user_id, push_token, opted_in, logged_in, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    if dialect.paramstyle != "qmark":
        statement = statement.replace("?", "%s")
    for start in range(0, count, batch):
        rows = [
            (app_id, f"d-{user}", user, token_of(user), True, True, stamp)
            for user in users[start : start + batch]
        ]
        with session_scope() as session:
            session.connection().exec_driver_sql(statement, rows)
    return Audience(org_id=org_id, campaign_id=campaign_id, users=users)


def csv_bytes(users: list[str]) -> bytes:
    lines = ["User,first_name,order_id"]
    lines += [f"{user},Ada{n % 997},A-{n:08d}" for n, user in enumerate(users)]
    return ("\n".join(lines) + "\n").encode()


def create_csv_request(audience: Audience, content: bytes) -> str:
    """A send-now CSV request, through ``create_request`` (as the API creates one)."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.services.requests import create_request
    from campaign_trigger.services.trigger_input import TriggerInput
    from campaign_trigger.services.uploads import StoredUpload, copy_to_storage
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.files import get_storage, upload_key

    settings = get_settings()
    storage = get_storage(settings)
    request_id = uuid.uuid4().hex
    writer = copy_to_storage(
        io.BytesIO(content), storage=storage, key=upload_key(request_id), max_bytes=2**40
    )
    upload = StoredUpload.of(writer, filename="batch.csv", content_type="text/csv")
    trigger = TriggerInput(campaign_id=audience.campaign_id, upload=upload)
    with session_scope() as session:
        return create_request(
            session=session,
            settings=settings,
            storage=storage,
            org_id=audience.org_id,
            request_id=request_id,
            trigger=trigger,
        )


def tree_cpu(process: psutil.Process) -> float:
    """User + system CPU of ``process`` and its descendants alive now (one that has ended
    counts nothing; a process gone: 0)."""
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for each in family:
        with suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system
    return total


def _pin_threads(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (an affinity is a thread's own; the
    threads a pinned thread starts inherit it)."""
    with suppress(FileNotFoundError):  # a process that has just ended
        for tid in os.listdir(f"/proc/{pid}/task"):
            with suppress(OSError):  # a thread that has just ended
                os.sched_setaffinity(int(tid), cpus)


@contextmanager
def moved_to(cpus: set[int]) -> Iterator[None]:
    """This process (every thread) on ``cpus`` meanwhile, then back where it was."""
    was = os.sched_getaffinity(0)
    _pin_threads(os.getpid(), cpus)
    try:
        yield
    finally:
        _pin_threads(os.getpid(), was)


def pin_apart(cpu: int = 0) -> set[int]:
    """Pin this process (its threads, and the processes and threads it starts from now
    on) to ``cpu``, and the stack's Prefect server and nginx (every process this one has
    started so far, and a shared stack's server) to the other CPUs: the server's work for
    the runs no longer takes turns on the cores with the process delivering, as on the
    production layout's own server (docs/postgres-and-workers.md). Returns the others."""
    others = os.sched_getaffinity(0) - {cpu}
    if not others:
        raise SystemExit("pinning apart needs at least two CPUs")
    server = int(os.environ.get(PREFECT_PID, 0))
    started = {child.pid for child in psutil.Process().children(recursive=True)}
    for pid in started | ({server} if server else set()):
        _pin_threads(pid, others)
    _pin_threads(os.getpid(), {cpu})
    return others


class Answering:
    """A child process (``command``) that prints ``ready`` once started, then answers each
    line written to it with one line of its own: a benchmark's second process driven
    round by round. Its standard error goes to ``log_path`` (this process's without)."""

    def __init__(self, command: list[str], what: str, log_path: Path | None = None) -> None:
        self.what = what
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_path.open("wb") if log_path else None,
            text=True,
            preexec_fn=die_with_parent,
        )
        assert self._line() == "ready", f"{what} did not start"

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.what} ended ({self.process.wait()})")
        return line.strip()

    def ask(self) -> str:
        """Its answer to the next line."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self._line()

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


class Worker:
    """A ``campaign-trigger worker`` child process, its RSS and CPU time (its threads'
    each) sampled every 20 ms."""

    def __init__(
        self, home: Path, *options: str, command: list[str] | None = None, **env: str
    ) -> None:
        """``command``: what runs ``campaign-trigger worker`` with the options that follow
        it (``python -m campaign_trigger.cli worker`` unless given)."""
        self.log_path = home / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.process = subprocess.Popen(
            [
                *(command or [sys.executable, "-m", "campaign_trigger.cli", "worker"]),
                "--concurrency",
                "4",
                *options,
            ],
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            preexec_fn=die_with_parent,  # a benchmark that crashes leaves no worker behind
        )
        self._start_sampler()
        while b"ready: polling" not in self.log_path.read_bytes():
            if self.process.poll() is not None:
                raise RuntimeError(self.log_path.read_text())
            time.sleep(0.1)

    def _start_sampler(self) -> None:
        self.peak_rss = 0
        self._cpu: list[tuple[float, float]] = []  # (time.time(), CPU seconds so far)
        self._threads: list[dict[int, float]] = []  # each thread's, at the same samples
        self._stop = threading.Event()
        self._sampling = threading.Event()
        self._sampling.set()
        self._sample_lock = threading.Lock()  # held while a sample is taken
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        process = psutil.Process(self.process.pid)
        while not self._stop.is_set():
            self._sampling.wait()
            with self._sample_lock:
                if not self._sampling.is_set():
                    continue  # paused between the wait and the lock
                try:
                    self.peak_rss = max(self.peak_rss, process.memory_info().rss)
                    times = process.cpu_times()
                    threads = thread_cpu(process.pid)
                except (psutil.Error, FileNotFoundError):
                    return
                self._cpu.append((time.time(), times.user + times.system))
                self._threads.append(threads)
            time.sleep(0.02)

    @contextmanager
    def unsampled(self) -> Iterator[None]:
        """No sampling meanwhile: the sampler's thread (psutil every 20 ms, ~2 % of a core
        and the GIL taken 50 times a second) would slow whatever this process times.
        A sample under way when it is called ends before it returns."""
        self._sampling.clear()
        with self._sample_lock:
            pass
        try:
            yield
        finally:
            self._sampling.set()

    def cpu_seconds_between(self, start: float, end: float) -> float:
        """The process's CPU seconds from ``start`` to ``end`` (``time.time()`` values),
        from the samples nearest inside them (within 20 ms of each end)."""
        inside = [(t, cpu) for t, cpu in self._cpu if start <= t <= end]
        assert len(inside) >= 2, (start, end, len(self._cpu))
        (first, cpu_first), (last, cpu_last) = inside[0], inside[-1]
        return (cpu_last - cpu_first) * (end - start) / (last - first)

    def thread_cpu_between(self, start: float, end: float) -> dict[str, float]:
        """Each thread's CPU seconds from ``start`` to ``end``, as
        :meth:`cpu_seconds_between` reads the process's, by thread name (the threads
        that ended meanwhile left out)."""
        inside = [n for n, (t, _) in enumerate(self._cpu) if start <= t <= end]
        assert len(inside) >= 2, (start, end, len(self._cpu))
        first, last = self._threads[inside[0]], self._threads[inside[-1]]
        scale = (end - start) / (self._cpu[inside[-1]][0] - self._cpu[inside[0]][0])
        return threads_spent(self.process.pid, first, last, scale)

    def stop(self) -> None:
        self._stop.set()
        self._sampling.set()
        stop_process(self.process)


def thread_switches(pid: int) -> tuple[int, int]:
    """The voluntary and involuntary context switches of process ``pid``'s live threads
    (``/proc``: psutil counts the main thread's alone; a thread that ends between two
    readings takes its count with it)."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary += int(line.split()[1])
    return voluntary, involuntary


async def wait_processed(request_id: str, timeout: float) -> float:
    """Seconds until the request's run is Completed (raises on another final state).

    Watches the request's row in the service's database, and reads the run from Prefect
    only once the row says it ended: a read of the run every 0.2 s cost the Prefect server
    ~5 calls a second during the run being measured (a tenth of its CPU per chunk in
    ``chunk_overhead.py``)."""
    from prefect import get_client

    from campaign_trigger.services.scheduling import drain_outbox
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Request, RequestState

    async def drain() -> None:
        with session_scope() as session:
            await drain_outbox(session=session)

    ended = {RequestState.processed, RequestState.failed, RequestState.canceled}
    started = time.monotonic()
    await drain()
    async with get_client() as client:
        while time.monotonic() - started < timeout:
            with session_scope() as session:
                row = session.get(Request, request_id)
                run_id = row.flow_run_id if row is not None else None
                state = row.state if row is not None else None
            if run_id is None:
                await drain()
            elif state in ended:
                run = await client.read_flow_run(uuid.UUID(run_id))
                if run.state is not None and run.state.is_final():
                    if run.state.type.value != "COMPLETED":
                        raise RuntimeError(f"the request ended {run.state}")
                    return time.monotonic() - started
            await asyncio.sleep(0.2)
    raise TimeoutError(f"request {request_id} not processed in {timeout} s")


def request_run_id(request_id: str) -> uuid.UUID:
    """The id of the request's flow run (the request has one)."""
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Request

    with session_scope() as session:
        row = session.get(Request, request_id)
        assert row is not None
        assert row.flow_run_id is not None
        return uuid.UUID(row.flow_run_id)


async def share_runs(request_id: str) -> list[FlowRun]:
    """The request's share runs: the ``deliver-chunks`` subflows of its flow run."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    run_id = request_run_id(request_id)
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])
            )
        )


async def task_runs_recorded() -> None:
    """Wait until the task-run events sent so far are recorded: the stack's Prefect server
    writes them about once a second (``deployments/prefect_server.py``), so a request can
    be processed before its last task run's end shows."""
    from campaign_trigger.deployments.prefect_server import RECORDER_FLUSH_SECONDS

    await asyncio.sleep(RECORDER_FLUSH_SECONDS + 0.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Where the median of what ``values`` sample lies: the innermost pair of order
    statistics (the k-th smallest and the k-th largest) that holds it with at least
    ``confidence``, distribution-free (each value falls below the median with probability
    1/2); returns (low, high, the pair's own confidence).

    With 12 values, the 3rd and the 10th smallest (96.1 %); with fewer than 6, none holds
    it with 95 %, and the range of the values is given with its own confidence."""
    n = len(values)
    ordered = sorted(values)

    def below(k: int) -> float:  # P(fewer than k of the n values fall below the median)
        return sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k < n // 2 and 2 * below(k + 1) <= 1 - confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * below(k)


def start_process(home: Path, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    """A child process in its own session, ended with this one, its output in
    ``home/<name>.log``."""
    return subprocess.Popen(
        argv,
        stdout=(home / f"{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
        preexec_fn=die_with_parent,
    )


def start_send_now_stack(home: Path) -> tuple[str, str, list[subprocess.Popen[bytes]]]:
    """The sandbox, the API and a worker (concurrency 8, its run logs at INFO, as ``up``
    runs it) on free ports beside the private stack in ``home``; returns the API's and the
    sandbox's URLs and the processes (sandbox, API, worker) once the worker polls (it has
    registered its deployments then)."""
    from campaign_trigger.config import get_settings

    ports = {name: free_port() for name in ("API", "SANDBOX", "SANDBOX_TLS")}
    os.environ.update({f"CT_{name}_PORT": str(port) for name, port in ports.items()})
    get_settings.cache_clear()
    cli = [sys.executable, "-m", "campaign_trigger.cli"]
    processes = [
        start_process(home, "sandbox", [*cli, "sandbox"]),
        start_process(home, "api", [*cli, "api"]),
        start_process(
            home, "worker", [*cli, "worker", "--concurrency", "8"], PREFECT_LOGGING_LEVEL="INFO"
        ),
    ]
    api, sandbox = f"http://127.0.0.1:{ports['API']}", f"http://127.0.0.1:{ports['SANDBOX']}"
    try:
        wait_http(f"{api}/health")
        wait_http(f"{sandbox}/sandbox/stats")
        while b"ready: polling" not in (home / "worker.log").read_bytes():
            if processes[2].poll() is not None:
                raise RuntimeError((home / "worker.log").read_text()[-2000:])
            time.sleep(0.1)
    except BaseException:
        for process in processes:
            process.terminate()
        raise
    return api, sandbox, processes


class Profile:
    """py-spy on each process for ``seconds``, and the CPU each used meanwhile."""

    def __init__(self, folder: Path, processes: dict[str, psutil.Process], seconds: float):
        folder.mkdir(parents=True, exist_ok=True)
        self.processes = processes
        self.cpu = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
        self.spies = [
            subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(process.pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "50",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(folder / f"{name}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, process in processes.items()
        ]

    def cpu_per_request(self, requests: int) -> dict[str, float]:
        """CPU seconds per request of each process since the start."""
        used = {name: sum(p.cpu_times()[:2]) for name, p in self.processes.items()}
        for spy in self.spies:
            spy.wait(timeout=120)
        return {name: (used[name] - self.cpu[name]) / requests for name in used}


def member_token(org_id: int) -> str:
    """A bearer token of a new member account of the organisation."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.services.auth import issue_token
    from campaign_trigger.services.passwords import hash_password
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Account, Role

    with session_scope() as session:
        account = Account(
            org_id=org_id,
            email=f"bench-{uuid.uuid4().hex[:8]}@example.com",
            password_hash=hash_password("bench-password"),
            role=Role.member,
        )
        session.add(account)
        session.flush()
        return issue_token(settings=get_settings(), account=account)


def thread_cpu(pid: int) -> dict[int, float]:
    """The CPU seconds each live thread of process ``pid`` has run so far, by native
    thread id (``/proc``'s scheduler statistics, in nanoseconds: exact where the
    ``stat`` file's ticks are 10 ms)."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that ended meanwhile
            seconds[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
    return seconds


def thread_names(pid: int) -> dict[int, str]:
    """Process ``pid``'s Python threads' names by native thread id, read by ``py-spy
    dump`` (none without py-spy: ``pip install py-spy``; it needs root)."""
    spy = BIN / "py-spy"
    if not spy.exists():
        return {}
    dump = subprocess.run(
        [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return dumped_thread_names(dump)


def dumped_thread_names(dump: str) -> dict[int, str]:
    """The threads' names in ``py-spy dump``'s text (``Thread 7558 (idle): "sleeper"``),
    by the id it gives (the native one on Linux)."""
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread "):
            tid, _, rest = line.removeprefix("Thread ").partition(" ")
            with suppress(ValueError):  # not a thread's heading
                names[int(tid, 0)] = rest.partition(": ")[2].strip('"')
    return names


def threads_spent(
    pid: int, before: dict[int, float], after: dict[int, float], scale: float = 1.0
) -> dict[str, float]:
    """Process ``pid``'s threads' CPU seconds between two :func:`thread_cpu` readings
    (times ``scale``), by thread name (threads of one name summed)."""
    names = thread_names(pid)
    spent: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, f"thread {tid}")
        spent[name] = spent.get(name, 0.0) + (seconds - before.get(tid, 0.0)) * scale
    return spent
