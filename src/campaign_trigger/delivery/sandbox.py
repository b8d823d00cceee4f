"""The sandbox: one local server standing in for FCM, Google's token endpoint and APNs.

Listens on a cleartext port (``CT_SANDBOX_PORT``, 8010) and a TLS port
(``CT_SANDBOX_TLS_PORT``, 8443; certificate from a local CA in ``CT_HOME``,
``sandbox-tls.py``), each speaking HTTP/1.1 and HTTP/2. Routes (``sandbox_routes.py``):

* ``POST /token`` — Google's OAuth2 token endpoint (JWT-bearer grant, assertions checked
  against the known keys, ``sandbox_google.py``);
* ``POST /v1/projects/{project}/messages:send`` — FCM HTTP v1 (``sandbox_google.py``);
* ``POST /3/device/{token}`` — APNs over HTTP/2 (provider JWTs checked,
  ``sandbox_apns.py``);
* ``GET /sandbox/deliveries?token=``, ``DELETE /sandbox/deliveries``,
  ``GET /sandbox/stats``, ``GET|PUT /sandbox/config`` (``{"latency_ms": ...}``),
  ``GET|POST /sandbox/keys`` (register a public key, as in a provider's console).

The device token decides the outcome (``sandbox_rules.py``); docs/sandbox.md has it all.
State lives in the memory of the process (:class:`SandboxState`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import uvloop

from campaign_trigger import heap
from campaign_trigger.config import get_settings
from campaign_trigger.delivery import sandbox_rules as rules
from campaign_trigger.delivery.sandbox_keys import service_key_ring
from campaign_trigger.delivery.sandbox_server import SandboxServer
from campaign_trigger.delivery.sandbox_state import SandboxState
from campaign_trigger.delivery.sandbox_tls import ensure_server_files, server_context

log = logging.getLogger(__name__)


def new_state(*, home: Path | None = None, latency_ms: float = 0) -> SandboxState:
    """A sandbox memory that knows the service's sandbox keys of ``home`` (CT_HOME)."""
    settings = get_settings()
    keys = service_key_ring(
        home=home or settings.home,
        apns_key_id=settings.apns_key_id,
        apns_team_id=settings.apns_team_id,
    )
    return SandboxState(latency_ms=latency_ms, keys=keys)


async def serve_async(
    *,
    host: str,
    port: int,
    tls_port: int | None = None,
    latency_ms: float = 0,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    state: SandboxState | None = None,
    home: Path | None = None,
    on_ready: Callable[[], None] | None = None,
    freeze_gc: bool = False,
) -> None:
    """Serve until ``shutdown_trigger`` returns (or SIGINT/SIGTERM without one);
    ``freeze_gc`` when the process is the sandbox's own (``campaign-trigger sandbox``)."""
    home = home or get_settings().home
    sandbox = state or new_state(home=home, latency_ms=latency_ms)
    context = None
    if tls_port is not None:
        context = server_context(ensure_server_files(home, host=host))
    server = SandboxServer(sandbox, host=host, port=port, tls_port=tls_port, tls_context=context)
    await server.start()
    if on_ready is not None:
        on_ready()
    if freeze_gc:
        # everything loaded so far lives as long as the process: the collector's full
        # passes skip it (they were ~15 % of the CPU of an FCM send before)
        heap.settle()
    try:
        if shutdown_trigger is not None:
            await shutdown_trigger()
        else:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            await stop.wait()
    finally:
        await server.close()


def serve(*, host: str, port: int, tls_port: int | None = None, latency_ms: float = 0) -> None:
    """Run the sandbox in the foreground until interrupted (``campaign-trigger sandbox``)."""
    home = get_settings().home

    def ready() -> None:
        log.info("sandbox providers on http://%s:%s (HTTP/1.1 and h2c)", host, port)
        if tls_port is not None:
            log.info(
                "sandbox providers on https://%s:%s (ALPN h2, http/1.1); CA: %s",
                host,
                tls_port,
                (home / "sandbox-ca.pem").resolve(),
            )

    uvloop.run(
        serve_async(
            host=host,
            port=port,
            tls_port=tls_port,
            latency_ms=latency_ms,
            on_ready=ready,
            freeze_gc=True,
        )
    )


@contextlib.contextmanager
def running_sandbox(
    *,
    host: str = "127.0.0.1",
    port: int,
    tls_port: int | None = None,
    latency_ms: float = 0,
    home: Path | None = None,
) -> Iterator[SandboxState]:
    """Run the sandbox in a background thread (uvloop) for the duration of the block."""
    state = new_state(home=home, latency_ms=latency_ms)
    loop = uvloop.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    async def main() -> None:
        async def trigger() -> None:
            await stop.wait()

        try:
            await serve_async(
                host=host,
                port=port,
                tls_port=tls_port,
                shutdown_trigger=trigger,
                state=state,
                home=home,
                on_ready=started.set,
            )
        except BaseException as exc:
            failure.append(exc)
            started.set()
            raise

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), daemon=True, name=f"sandbox-{port}"
    )
    thread.start()
    if not started.wait(30) or failure:
        raise RuntimeError(f"sandbox did not start on {host}:{port}: {failure or 'timeout'}")
    try:
        yield state
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        if not thread.is_alive():
            loop.close()


__all__ = ["SandboxState", "new_state", "rules", "running_sandbox", "serve", "serve_async"]
