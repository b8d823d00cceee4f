"""The sandbox: one local server standing in for FCM, Google's token endpoint and APNs.

Routes (HTTP/1.1 and cleartext HTTP/2 with prior knowledge on the same port):

* ``POST /token`` — the OAuth2 JWT-bearer grant, answered like Google's endpoint;
* ``POST /v1/projects/{project}/messages:send`` — FCM HTTP v1 (a ``denied-*`` project
  answers 403 PERMISSION_DENIED, an access token we did not issue 401);
* ``POST /3/device/{token}`` — APNs (key id or team id ``DENIED*`` → 403
  InvalidProviderToken);
* ``GET /sandbox/deliveries?token=``, ``GET /sandbox/stats``, ``DELETE /sandbox/deliveries``,
  ``PUT /sandbox/config`` (``{"latency_ms": ...}``).

The device token decides the outcome (:func:`campaign_trigger.delivery.sandbox_rules.outcome`).
Answers copy the real providers' bodies. State lives in the memory of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from campaign_trigger.delivery import sandbox_rules as rules
from campaign_trigger.delivery.sandbox_rules import SandboxState

log = logging.getLogger(__name__)


def _json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(body),
        status_code=status,
        headers=headers,
        media_type="application/json; charset=UTF-8",
    )


def create_app(state: SandboxState | None = None) -> Starlette:
    """The sandbox ASGI application (``app.state.sandbox`` holds its memory)."""
    sandbox = state or SandboxState()

    async def pause() -> None:
        if sandbox.latency_ms > 0:
            await asyncio.sleep(sandbox.latency_ms / 1000)

    async def token(request: Request) -> Response:
        form = await request.form()
        status, body = sandbox.issue_token(
            grant_type=str(form.get("grant_type", "")), assertion=str(form.get("assertion", ""))
        )
        return _json_response(status, body)

    async def fcm_send(request: Request) -> Response:
        await pause()
        status, body, headers = sandbox.fcm_send(
            project=request.path_params["project"],
            authorization=request.headers.get("authorization", ""),
            raw=await request.body(),
        )
        return _json_response(status, body, headers)

    async def apns_send(request: Request) -> Response:
        await pause()
        status, body, headers = sandbox.apns_send(
            device_token=request.path_params["token"],
            headers=request.headers,
            raw=await request.body(),
            http_version=request.scope.get("http_version", "1.1"),
        )
        if body is None:
            return Response(b"", status_code=status, headers=headers)
        return _json_response(status, body, headers)

    async def deliveries(request: Request) -> Response:
        if request.method == "DELETE":
            sandbox.clear()
            return JSONResponse({"cleared": True})
        return JSONResponse(sandbox.deliveries_for(request.query_params.get("token")))

    async def stats(_: Request) -> Response:
        return JSONResponse(sandbox.stats())

    async def config(request: Request) -> Response:
        try:
            changes = await request.json()
            sandbox.configure(**changes)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error_message": f"bad config: {exc}"}, status_code=400)
        return JSONResponse({"latency_ms": sandbox.latency_ms})

    app = Starlette(
        routes=[
            Route("/token", token, methods=["POST"]),
            Route("/v1/projects/{project}/messages:send", fcm_send, methods=["POST"]),
            Route("/3/device/{token}", apns_send, methods=["POST"]),
            Route("/sandbox/deliveries", deliveries, methods=["GET", "DELETE"]),
            Route("/sandbox/stats", stats, methods=["GET"]),
            Route("/sandbox/config", config, methods=["PUT"]),
        ]
    )
    app.state.sandbox = sandbox
    return app


def _config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.h2_max_concurrent_streams = 1000
    config.keep_alive_timeout = 75
    return config


async def serve_async(
    *,
    host: str,
    port: int,
    latency_ms: float = 0,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    state: SandboxState | None = None,
) -> None:
    """Serve the sandbox until ``shutdown_trigger`` returns (or SIGINT/SIGTERM without one)."""
    sandbox = state or SandboxState(latency_ms=latency_ms)
    app = create_app(sandbox)
    if shutdown_trigger is None:
        await hypercorn_serve(app, _config(host, port))  # type: ignore[arg-type]
    else:
        await hypercorn_serve(app, _config(host, port), shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]


def serve(*, host: str, port: int, latency_ms: float = 0) -> None:
    """Run the sandbox in the foreground until interrupted (``campaign-trigger sandbox``)."""
    log.info("sandbox providers on http://%s:%s (HTTP/1.1 and h2c)", host, port)
    asyncio.run(serve_async(host=host, port=port, latency_ms=latency_ms))


@contextlib.contextmanager
def running_sandbox(
    *, host: str = "127.0.0.1", port: int, latency_ms: float = 0
) -> Iterator[SandboxState]:
    """Run the sandbox in a background thread for the duration of the block."""
    state = SandboxState(latency_ms=latency_ms)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()

    async def main() -> None:
        async def trigger() -> None:
            await stop.wait()

        server = asyncio.ensure_future(
            serve_async(host=host, port=port, shutdown_trigger=trigger, state=state)
        )
        await rules.wait_until_listening(host, port)
        started.set()
        await server

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), daemon=True, name=f"sandbox-{port}"
    )
    thread.start()
    if not started.wait(15):
        raise RuntimeError(f"sandbox did not start on {host}:{port}")
    try:
        yield state
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
