"""The FastAPI application: routers, error handlers, the quota header, health and metrics.

Run it with ``uvicorn --factory campaign_trigger.api.app:serve_app`` (or
``campaign-trigger api``). When ``PREFECT_API_URL`` names a server, the app also runs
the scheduling outbox's reconciler, which turns accepted requests into flow runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from campaign_trigger import __version__, heap
from campaign_trigger.api import auth, campaigns, devices, files, webhooks
from campaign_trigger.api.deps import SettingsDep
from campaign_trigger.api.docs import install_docs
from campaign_trigger.api.errors import customise_openapi, install_error_handlers
from campaign_trigger.api.limits import BodyLimitMiddleware
from campaign_trigger.api.middleware import ResponseHeadersMiddleware
from campaign_trigger.api.observability import ObservabilityMiddleware, install_observability
from campaign_trigger.config import get_settings
from campaign_trigger.services import health
from campaign_trigger.services import ingest as _ingest  # noqa: F401  (services/requests.py)
from campaign_trigger.store.files import get_storage


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


@contextlib.asynccontextmanager
async def _served_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """:func:`_lifespan`, then the process's start-up heap frozen (:func:`heap.settle`)."""
    async with _lifespan(app):
        heap.settle()
        yield


def serve_app() -> FastAPI:
    """The application of an API server process (``campaign-trigger api``, ``up``): once it
    has started, what it loaded (~260,000 objects) is frozen for the garbage collector,
    which then makes a young pass every 50,000 allocations instead of 700 (:mod:`heap`;
    400 calls, 10 at a time: ~90 young passes before, none after). Not for an
    application built in a process that does more (a test's)."""
    return create_app(lifespan=_served_lifespan)


def create_app(
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] = _lifespan,
) -> FastAPI:
    """Build the API application. Reads the settings first, so that a bad one (such as a
    CT_SECRET_KEY shorter than 32 bytes) stops the start with its reason. A local
    storage folder is made if missing; one that cannot be made shows in /health."""
    settings = get_settings()
    with contextlib.suppress(OSError):
        get_storage(settings).make_root()
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
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_docs(app)
    # the last added runs first: headers on every answer, then the quota, then limits
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(ResponseHeadersMiddleware)
    app.add_middleware(ObservabilityMiddleware)  # outermost: sees every answer
    app.include_router(auth.router)
    app.include_router(campaigns.router)
    app.include_router(files.router)
    app.include_router(devices.router)
    app.include_router(webhooks.router)

    @app.get(
        "/health",
        tags=["health"],
        responses={
            200: {
                "description": "Every part is up; `status` is `degraded` when a push "
                "provider is unreachable"
            },
            503: {
                "description": "A part the service needs is down (`status` `down`): "
                "`down` names it (`database`, `storage`, `prefect`); why is in the API's log"
            },
        },
    )
    async def read_health(settings: SettingsDep) -> JSONResponse:
        """The state of each part: the database, the storage of uploads and reports, the
        Prefect server (each `ok` or `unreachable`), and the push providers (FCM with its
        token endpoint, APNs: `ok` or `unreachable`). `status` is `ok` when every part is,
        `degraded` when only a provider is not, `down` (503) when the database, the storage
        or Prefect is. Why a part is not ok, and where it was looked for, is in the API's
        log and in `campaign-trigger status`, not in this unauthenticated answer."""
        report = await health.check(settings)
        health.log_reasons(report)
        return JSONResponse(health.public(report), status_code=503 if report["down"] else 200)

    install_observability(app)
    customise_openapi(app, extra_models=campaigns.BODY_MODELS)
    return app
