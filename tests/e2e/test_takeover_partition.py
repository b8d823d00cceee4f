"""End to end: a worker cut off from Prefect mid-chunk stops before its run is taken over."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from urllib.parse import urlsplit

import pytest

from campaign_trigger.config import get_settings
from campaign_trigger.delivery import freeze
from campaign_trigger.store.models import Platform
from e2e.conftest import Sandbox, WorkerFactory
from e2e.takeover_support import (
    KILL_CONCURRENCY,
    KILL_USERS,
    as_it_stands,
    dead_run_states,
    one_device_each,
    taken_over,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# A worker cut off from Prefect sends at 100 messages a second from then on: without its
# lease it would still be sending when its run is taken over (40 s later in the tests).
CUT_LATENCY_MS = 1000


class Partition:
    """A TCP relay to the Prefect server that can be cut, as a network partition cuts a
    link: from then on what either side sends is dropped, and a new connection is
    accepted and left unanswered. Connections and processes stay up. It relays on a
    thread of its own (the tests' loop waits for workers to start, blocking)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut = False
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> Partition:
        self._thread.start()
        assert self._ready.wait(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        # asyncio.run then cancels the relays left and waits for them

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            await self._pump(reader, None)
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        back = asyncio.create_task(self._pump(upstream_reader, writer))
        try:
            await self._pump(reader, upstream_writer)
        finally:
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await back

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None
    ) -> None:
        try:
            while data := await reader.read(65536):
                if writer is not None and not self.cut:
                    writer.write(data)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            if writer is not None and not self.cut:
                writer.close()


@pytest.mark.parametrize("platform", [Platform.android, Platform.ios])
async def test_a_worker_cut_off_from_prefect_stops_before_its_run_is_taken_over_sending_none_twice(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    platform: Platform,
) -> None:
    """A worker that can reach the database and the provider but no longer Prefect (a
    network partition, the server down), in the middle of a chunk: its runs' heartbeats
    stop reaching the server, which marks the run dead and hands it to another worker.
    Unfenced, the cut-off worker went on with its chunk and the next ones beside the
    taker, both sending the same messages. Its lease (delivery/freeze.py) lapses first:
    it starts no new message, records the answers to those in flight, and exits before
    the run can be marked dead; the taker sends the rest, and nobody gets it twice. Over
    HTTP/1.1 to FCM and over HTTP/2 to APNs.

    The sandbox answers slowly from the cut on (``CUT_LATENCY_MS``), so that without the
    fence the worker would still be sending when the taker starts."""
    env = {"CT_DELIVERY_CONCURRENCY": str(KILL_CONCURRENCY)}
    prefect_port = urlsplit(os.environ["PREFECT_API_URL"]).port
    assert prefect_port is not None
    with Partition(prefect_port) as partition:
        worker = start_worker(PREFECT_API_URL=partition.api_url, **env)
        before = len(sandbox.state.deliveries)
        request = one_device_each(platform, prefix="cut", chunk_size=5000)
        request_id, tokens = request.request_id, request.tokens
        latency = sandbox.state.latency_ms
        deadline = time.monotonic() + 120
        while len(sandbox.state.deliveries) - before < 7_300:  # inside the second chunk
            assert time.monotonic() < deadline, worker.log_tail()
            await asyncio.sleep(0.002)
        sandbox.state.configure(latency_ms=CUT_LATENCY_MS)
        try:
            partition.cut = True
            cut_at = time.monotonic()
            exit_code = await asyncio.to_thread(worker.popen.wait, 60)
            lasted = time.monotonic() - cut_at
            assert exit_code == freeze.EXIT_CODE, worker.log_tail()
            print(f"cut off: exited {lasted:.1f} s after the cut")
            assert "has reached Prefect for" in worker.log_tail()
            # the lease lapsed before the run could be marked dead (40 s without a heartbeat)
            assert lasted < get_settings().dead_run_after_seconds, lasted
            assert await dead_run_states(request_id) == 0
            await asyncio.sleep(CUT_LATENCY_MS / 1000 + 1)  # its last sends land
        finally:
            sandbox.state.configure(latency_ms=latency)
    cut_off = as_it_stands(worker, sandbox, request)
    assert cut_off.recorded < KILL_USERS  # it stopped with messages left to send
    assert cut_off.in_flight == 0  # every message it sent has its answer recorded
    await taken_over(start_worker, sandbox, cut_off, env=env)
    assert await dead_run_states(request_id) == 1
    assert set(sandbox.delivered(tokens).values()) == {1}
