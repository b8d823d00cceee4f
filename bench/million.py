"""A million in a minute: 1 M recipients through the whole stack, upload -> report.

One stack (``harness.private_stack``: a Prefect server on SQLite, the service's SQLite
database), the API (``campaign-trigger api``) and one ``campaign-trigger worker``; a bare
nginx from Debian, configured here, answers as the provider: FCM over HTTP/1.1
(``harness.nginx_responder``), or with ``--ios`` APNs over TLS with ALPN h2 (nginx's
``http2``, a certificate of the sandbox's CA in the stack's ``CT_HOME``, as
``bench/apns_http2.py`` configures it). N users with one device each (Android, or iOS
with ``--ios``); their CSV is uploaded through ``POST /api/campaigns/trigger``, send now;
the measure ends when the report's links answer. Every report row is checked: N rows,
each a success, each device once.

Each stage's time and share, read from what the service and Prefect store: upload and
validation (the API's answer), waiting to start (answer -> the ``prepare delivery`` task
run's start), prepare, the chunks' delivery (prepare's end -> the last ``deliver chunk``
task run's end; its first send and last send from the outcome log), the report
(``assemble report``) and until the links answer. Also the CPU each of the stack's
processes used meanwhile (worker, API, Prefect server, nginx), the worker's and the API's
peak RSS, and the reference measured in the same run, the same nginx, after the request: the
bare send of the same N messages through the provider's ``send_many`` in this process
(batches of 20,000), so the ratio says how much is orchestration.

Targets (issue 14): <= 60 s for 1 M Android recipients, <= 90 s with iOS (APNs); a run
of fewer recipients is not judged.
``--profile DIR`` records the worker and the API with py-spy (``--gil``: the thread
holding the GIL, collapsed stacks in ``DIR/worker.txt`` and ``DIR/api.txt``; install it
with ``.venv/bin/uv pip install --python .venv/bin/python py-spy``).

Needs ``apt-get install nginx-light``.
Usage: ``.venv/bin/python bench/million.py [--users 1000000] [--ios] [--profile DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from apns_http2 import NGINX_CONF as NGINX_HTTP2_CONF
from harness import (
    Worker,
    csv_bytes,
    free_port,
    member_token,
    nginx_responder,
    private_stack,
    report_links,
    result,
    seed_audience,
    start_nginx,
    start_process,
    stop_process,
    task_runs_recorded,
    token_of,
    tree_cpu,
    wait_http,
)
from sandbox import wait_port

TARGET = {"android": 60.0, "ios": 90.0}
REFERENCE_BATCH = 20_000


class PeakRss:
    """The peak RSS of a process, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self._process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@contextmanager
def nginx_http2_responder(home: Path) -> Iterator[str]:
    """nginx answering APNs over TLS + h2 with a certificate of the sandbox CA in
    ``home`` (which the service trusts for its global APNs credentials)."""
    from campaign_trigger.delivery.sandbox_tls import ensure_server_files

    tls = ensure_server_files(home)
    folder = Path(tempfile.mkdtemp(prefix="bench-nginx-h2-"))
    port = free_port()
    (folder / "nginx.conf").write_text(
        NGINX_HTTP2_CONF.format(dir=folder, port=port, cert=tls.certificate, key=tls.key)
    )
    process = start_nginx(folder)
    try:
        wait_port(port)
        yield f"https://127.0.0.1:{port}"
    finally:
        stop_process(process)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def stack_and_responder(platform: str) -> Iterator[tuple[Path, str]]:
    """The private stack (its home) and the provider's nginx (its URL): FCM, or APNs
    over TLS + h2; the environment points the service's global credentials at it."""
    with private_stack() as home:
        from campaign_trigger.config import get_settings

        with ExitStack() as responder_stack:
            if platform == "ios":
                url = responder_stack.enter_context(nginx_http2_responder(get_settings().home))
                os.environ["CT_APNS_BASE_URL"] = url
            else:
                url = responder_stack.enter_context(nginx_responder())
                os.environ["CT_FCM_BASE_URL"] = url
                os.environ["CT_FCM_TOKEN_URI"] = f"{url}/token"
            get_settings.cache_clear()
            yield home, url


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """User + system CPU of each process and its children so far (0 once gone)."""
    return {name: tree_cpu(process) for name, process in processes.items()}


def stack_processes(worker: int, api: int) -> dict[str, psutil.Process]:
    """The stack's processes: worker, API, Prefect server, nginx."""
    found = {"worker": psutil.Process(worker), "API": psutil.Process(api)}
    for child in psutil.Process().children():
        command = " ".join(child.cmdline())
        if "prefect_server" in command:
            found["Prefect server"] = child
        elif "nginx" in command:
            found["nginx"] = child
    return found


class Spies:
    """py-spy recording processes until stopped (SIGINT makes it write its file)."""

    def __init__(self, folder: Path | None, processes: dict[str, int]) -> None:
        self.running: list[subprocess.Popen[bytes]] = []
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        spy = str(Path(sys.executable).parent / "py-spy")
        for name, pid in processes.items():
            self.running.append(
                subprocess.Popen(
                    [
                        *(spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw"),
                        *("--gil", "--nonblocking", "--output", str(folder / f"{name}.txt")),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(folder / f"{name}.py-spy.log").open("wb"),
                )
            )
        time.sleep(1.0)  # attached before the clock starts

    def stop(self) -> None:
        for process in self.running:
            process.send_signal(signal.SIGINT)
        for process in self.running:
            process.wait(timeout=120)


@dataclass
class Run:
    request_id: str
    started: float  # wall clock (epoch seconds): the upload begins
    answered: float  # the API answered the upload
    links: float  # the report's links answer
    report_rows: int


def upload_to_report(api: str, token: str, campaign_id: str, upload: Path, users: list[str]) -> Run:
    """Upload the CSV file ``upload`` (one row per user of ``users``), wait for the
    report's links, check every row of the report."""
    headers = {"Authorization": f"Bearer {token}"}
    started = time.time()
    with upload.open("rb") as content:
        created = httpx.post(
            f"{api}/api/campaigns/trigger",
            headers=headers,
            data={"campaign_id": campaign_id},
            files={"file": ("batch.csv", content, "text/csv")},
            timeout=3600,
        )
    answered = time.time()
    created.raise_for_status()
    request_id = created.json()["request_id"]
    reports = report_links(api, headers, request_id, timeout=3600)
    links = time.time()
    rows = check_report(reports, users)
    return Run(request_id, started, answered, links, rows)


def check_report(links: list[str], users: list[str]) -> int:
    """Download the report files (streamed to disk: a gigabyte's report is larger than
    its upload) and check them: one row per user, each a success, each device once."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    devices: list[pa.ChunkedArray] = []
    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        for n, link in enumerate(links):
            path = Path(folder) / f"{n}.csv"
            with httpx.stream("GET", link, timeout=600) as answer, path.open("wb") as out:
                answer.raise_for_status()
                for block in answer.iter_bytes(1 << 20):
                    out.write(block)
            table = pacsv.read_csv(
                path,
                convert_options=pacsv.ConvertOptions(
                    column_types={"device_id": pa.string(), "error_message": pa.string()},
                    include_columns=["device_id", "error_message"],
                    strings_can_be_null=False,
                ),
            )
            failed = pc.sum(pc.not_equal(table["error_message"], "")).as_py() or 0
            if failed:
                sample = table.filter(pc.not_equal(table["error_message"], "")).slice(0, 1)
                raise AssertionError(f"{failed} rows failed in {link}, e.g. {sample.to_pylist()}")
            devices.append(table["device_id"])
    found = pa.chunked_array([chunk for column in devices for chunk in column.chunks])
    assert len(found) == len(users), f"{len(found)} rows for {len(users)} users"
    expected = pa.array([f"d-{user}" for user in users])
    assert pc.count_distinct(found).as_py() == len(users), "a device is in the report twice"
    missing = len(found) - (pc.sum(pc.is_in(found, value_set=expected)).as_py() or 0)
    assert not missing, f"{missing} report rows name a device that was not targeted"
    return len(found)


def _at(moment: datetime | None) -> float:
    if moment is None:
        raise RuntimeError("a run without its time")
    return moment.timestamp()


async def _task_runs(run_ids: list[uuid.UUID]) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    await task_runs_recorded()
    found: list[Any] = []
    async with get_client() as client:
        while True:
            page = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=run_ids)),
                offset=len(found),
                limit=200,
            )
            found += page
            if len(page) < 200:
                return found


async def _share_runs(request_id: str) -> list[uuid.UUID]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    found: list[uuid.UUID] = []
    async with get_client() as client:
        while True:
            page = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[f"request:{request_id}"])
                ),
                offset=len(found),
                limit=200,
            )
            found += [run.id for run in page]
            if len(page) < 200:
                return found


def _in_flight(chunks: list[Any]) -> dict[int, float]:
    """Seconds with 0, 1, 2 … chunk task runs in flight, first start -> last end."""
    edges = sorted(
        [(_at(t.start_time), 1) for t in chunks] + [(_at(t.end_time), -1) for t in chunks]
    )
    seconds: dict[int, float] = {}
    count, since = 0, edges[0][0]
    for moment, step in edges:
        seconds[count] = seconds.get(count, 0.0) + moment - since
        count, since = count + step, moment
    return seconds


def stages(run: Run) -> tuple[list[tuple[str, float]], list[str]]:
    """Each stage's seconds, from what Prefect and the service stored; and details."""
    from sqlalchemy import func, select

    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Outcome, Request

    with session_scope() as session:
        request = session.get(Request, run.request_id)
        assert request is not None
        assert request.flow_run_id is not None
        main_run = uuid.UUID(request.flow_run_id)
        first_send, last_send = session.execute(
            select(func.min(Outcome.sent_at), func.max(Outcome.sent_at)).where(
                Outcome.request_id == run.request_id  # type: ignore[arg-type]
            )
        ).one()
    shares = asyncio.run(_share_runs(run.request_id))
    tasks = asyncio.run(_task_runs([main_run, *shares]))
    prepare = next(t for t in tasks if t.name == "prepare delivery")
    report = next(t for t in tasks if t.name == "assemble report")
    chunks = [t for t in tasks if t.name.startswith("deliver chunk")]
    chunk_start = min(_at(t.start_time) for t in chunks)
    chunk_end = max(_at(t.end_time) for t in chunks)
    chunk_busy = sum(_at(t.end_time) - _at(t.start_time) for t in chunks)
    prepared = _at(prepare.end_time)
    timeline = [
        ("upload + validation (API)", run.answered - run.started),
        ("waiting to start", _at(prepare.start_time) - run.answered),
        ("prepare", prepared - _at(prepare.start_time)),
        ("chunks' delivery", chunk_end - prepared),
        ("report", _at(report.end_time) - chunk_end),
        ("until the links answer", run.links - _at(report.end_time)),
    ]
    sending = _at(last_send) - _at(first_send)
    lanes = _in_flight(chunks)
    details = [
        f"chunks' delivery: {len(chunks)} chunk task runs in {len(shares)} deliver-chunks "
        f"runs; first chunk started {chunk_start - prepared:.1f} s after prepare; "
        f"{chunk_busy / len(chunks):.2f} s per chunk, {chunk_busy / (chunk_end - chunk_start):.1f} "
        f"chunks in flight on average",
        "chunks in flight (s): "
        + ", ".join(f"{count}: {seconds:.1f}" for count, seconds in sorted(lanes.items())),
        f"first send -> last send {sending:.1f} s ({run.report_rows / sending:,.0f} msgs/s); "
        f"first send {_at(first_send) - run.started:.1f} s after the upload began",
        f"report: assemble report task run {_at(report.end_time) - _at(report.start_time):.1f} s",
    ]
    return timeline, details


async def _bare_send(platform: str, users: list[str], campaign_id: str) -> float:
    """Seconds of ``send_many`` for the same messages, in batches (the reference)."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.delivery.base import PushMessage
    from campaign_trigger.delivery.providers import open_provider
    from campaign_trigger.services.delivering import collapse_id
    from campaign_trigger.store.models import Platform

    provider = open_provider(Platform(platform), settings=get_settings())
    request_id = uuid.uuid4().hex
    data = {"request_id": request_id, "campaign_id": campaign_id}

    def batch(start: int) -> list[PushMessage]:
        return [
            PushMessage(
                key=n,
                token=token_of(users[n]),
                title=f"Hello Ada{n % 997}",
                body=f"Order A-{n:08d} has shipped",
                data=data,
                collapse_id=collapse_id(request_id, n, f"d-{users[n]}"),
            )
            for n in range(start, min(len(users), start + REFERENCE_BATCH))
        ]

    try:
        await provider.send_many(batch(0)[:100])  # connections and token, as a worker has them
        seconds = 0.0
        failed = 0
        for start in range(0, len(users), REFERENCE_BATCH):
            messages = batch(start)
            began = time.perf_counter()
            results = await provider.send_many(messages)
            seconds += time.perf_counter() - began
            failed += sum(1 for r in results if r.error_message)
        assert not failed, f"{failed} bare sends failed"
        return seconds
    finally:
        await provider.aclose()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on a kill too
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--ios", action="store_true", help="iOS devices, APNs over TLS + h2")
    parser.add_argument("--profile", type=Path, help="py-spy the worker and the API into DIR")
    args = parser.parse_args()
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        sys.exit("nginx is missing: apt-get install nginx-light")
    platform = "ios" if args.ios else "android"
    load_before = os.getloadavg()
    cli = [sys.executable, "-m", "campaign_trigger.cli"]
    with stack_and_responder(platform) as (home, responder):
        print(f"stack up, provider {responder}; seeding {args.users:,} users …", flush=True)
        audience = seed_audience(args.users, platform=platform)
        upload = home / "batch.csv"
        upload.write_bytes(csv_bytes(audience.users))
        token = member_token(audience.org_id)
        api_port = free_port()
        api = start_process(home, "api", [*cli, "api"], CT_API_PORT=str(api_port))
        worker: Worker | None = None
        try:
            base = f"http://127.0.0.1:{api_port}"
            wait_http(f"{base}/health")
            worker = Worker(home)
            api_rss = PeakRss(api.pid)
            spies = Spies(args.profile, {"worker": worker.process.pid, "api": api.pid})
            processes = stack_processes(worker.process.pid, api.pid)
            cpu_before = cpu_seconds(processes)
            run = upload_to_report(base, token, audience.campaign_id, upload, audience.users)
            cpu_used = cpu_seconds(processes)
            spies.stop()
            api_peak = api_rss.stop()
        finally:
            if worker is not None:
                worker.stop()
            stop_process(api)
        load_after = os.getloadavg()
        timeline, details = stages(run)
        reference = asyncio.run(_bare_send(platform, audience.users, audience.campaign_id))
    total = run.links - run.started
    provider = "APNs (TLS, h2)" if args.ios else "FCM (HTTP/1.1)"
    print(
        f"\n{args.users:,} {platform} recipients, upload -> report links: {total:.1f} s "
        f"({args.users / total:,.0f} msgs/s); every row a success, each device once"
    )
    for name, seconds in timeline:
        print(f"  {name:28s} {seconds:7.1f} s  {seconds / total:6.1%}")
    for line in details:
        print(f"  {line}")
    print(
        "  CPU used during the request: "
        + ", ".join(f"{name} {cpu_used[name] - cpu_before[name]:.1f} s" for name in processes)
    )
    print(
        f"  worker peak RSS {worker.peak_rss / 2**20:.0f} MB, API peak RSS "
        f"{api_peak / 2**20:.0f} MB"
    )
    target = TARGET[platform]
    print(
        f"  reference: bare {provider} send_many of the same {args.users:,} messages "
        f"{reference:.1f} s ({args.users / reference:,.0f} msgs/s)"
    )
    result(
        "million",
        f"{args.users:,} {platform} recipients, upload -> report links",
        figure=f"{total:.1f} s",
        reference=f"{reference:.1f} s (bare {provider} send_many of the same messages)",
        ratio=total / reference,
        target=f"<= {target:.0f} s for 1 M",
        met=total <= target if args.users >= 1_000_000 else None,
        why="" if args.users >= 1_000_000 else "quick size: judged at 1 M recipients",
    )
    print(
        f"(load average {load_before[0]:.1f} before, {load_after[0]:.1f} after the request, "
        f"{os.cpu_count()} CPUs; the machine may be shared)"
    )


if __name__ == "__main__":
    main()
