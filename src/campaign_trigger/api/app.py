"""The FastAPI application: routers, error handlers, the quota header and the health check.

Run it with ``uvicorn --factory campaign_trigger.api.app:create_app`` (or
``campaign-trigger api``). When ``PREFECT_API_URL`` names a server, the app also runs
the scheduling outbox's reconciler, which turns accepted requests into flow runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import text

from campaign_trigger import __version__
from campaign_trigger.api import auth, campaigns, devices, files, webhooks
from campaign_trigger.api.docs import install_docs
from campaign_trigger.api.errors import customise_openapi, install_error_handlers
from campaign_trigger.api.limits import BodyLimitMiddleware
from campaign_trigger.api.middleware import ResponseHeadersMiddleware
from campaign_trigger.config import get_settings
from campaign_trigger.store.db import get_engine


def _database_ok() -> bool:
    try:
        with get_engine().connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception:
        return False
    return True


async def _prefect_ok() -> bool:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return False
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            response = await client.get(f"{url.rstrip('/')}/health")
    except httpx.HTTPError:
        return False
    return response.status_code == 200


PROVIDER_CHECK_SECONDS = 2.0


async def _reachable(url: str) -> str:
    """ "ok" when a TCP connection to ``url``'s host and port is accepted, else why not."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(PROVIDER_CHECK_SECONDS):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except TimeoutError:
        return f"no answer from {parts.hostname}:{port} in {PROVIDER_CHECK_SECONDS:.0f} s"
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
        return f"{why} ({parts.hostname}:{port})"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return "ok"


async def _providers() -> dict[str, dict[str, str]]:
    """Whether this process can reach the push providers it would send to (the sandbox
    when no credentials are configured): FCM with its token endpoint, and APNs."""
    settings = get_settings()
    fcm, fcm_token, apns = await asyncio.gather(
        _reachable(settings.fcm_base_url),
        _reachable(settings.fcm_token_uri),
        _reachable(settings.apns_base_url),
    )
    fcm_error = next((e for e in (fcm, fcm_token) if e != "ok"), None)
    return {
        "fcm": _provider_state(settings.fcm_base_url, fcm_error),
        "apns": _provider_state(settings.apns_base_url, None if apns == "ok" else apns),
    }


def _provider_state(url: str, error: str | None) -> dict[str, str]:
    if error is None:
        return {"status": "ok", "url": url}
    return {"status": "unreachable", "url": url, "error": error}


@contextlib.asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    """Run the outbox reconciler beside the API when a Prefect server is configured, and
    share one Prefect client among the API's calls."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value() or not get_settings().api_reconciler:
        yield
        return
    from campaign_trigger.services import prefect_runs, scheduling
    from campaign_trigger.store.db import session_scope

    stop = asyncio.Event()
    task = asyncio.create_task(scheduling.run_reconciler(sessions=session_scope, stop=stop))
    try:
        async with prefect_runs.shared_client():
            yield
    finally:
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=5)


def create_app() -> FastAPI:
    """Build the API application. Reads the settings first, so that a bad one (such as a
    CT_SECRET_KEY shorter than 32 bytes) stops the start with its reason."""
    get_settings()
    app = FastAPI(
        title="campaign-trigger",
        version=__version__,
        description="Send batches of transactional push and in-app messages through "
        'API-trigger campaigns. Every non-200 answer is `{"error_message": "..."}`. '
        "Calls to create, cancel, list and report take one unit of the organisation's "
        "request quota each; their answers carry `X-Quota-Remaining`. Bodies are "
        "limited before they are read (413): 4 KB for sign-in, 8 KB for the device "
        "routes, `json_messages_cap` x 2 KB for a JSON create, 1 GB for a CSV upload. "
        "Failed sign-ins are throttled per account and per client address (429).",
        lifespan=_lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_docs(app)
    # the last added runs first: headers on every answer, then the quota, then limits
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(ResponseHeadersMiddleware)
    app.include_router(auth.router)
    app.include_router(campaigns.router)
    app.include_router(files.router)
    app.include_router(devices.router)
    app.include_router(webhooks.router)

    @app.get(
        "/health",
        tags=["health"],
        responses={
            200: {"description": "The API serves; `status` is `degraded` when a part is not ok"},
            503: {"description": "The database is unreachable: this API cannot serve"},
        },
    )
    async def read_health() -> JSONResponse:
        """The state of each dependency: the database, the Prefect server and the push
        providers (FCM with its token endpoint, APNs: reachable or not, with the URL and
        the error). `status` is `ok` only when every part is; the answer is 503 only
        when the database is down."""
        database = _database_ok()
        prefect, providers = await asyncio.gather(_prefect_ok(), _providers())
        healthy = database and prefect and all(p["status"] == "ok" for p in providers.values())
        body: dict[str, Any] = {
            "status": "ok" if healthy else "degraded",
            "database": "ok" if database else "unreachable",
            "prefect": "ok" if prefect else "unreachable",
            "providers": providers,
            "version": __version__,
        }
        return JSONResponse(body, status_code=200 if database else 503)

    customise_openapi(app, extra_models=campaigns.BODY_MODELS)
    return app
