"""The FastAPI application: routers, error handlers and the health check."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import text

from campaign_trigger import __version__
from campaign_trigger.api import devices
from campaign_trigger.api.errors import install_error_handlers
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


def create_app() -> FastAPI:
    """Build the API application."""
    app = FastAPI(
        title="campaign-trigger",
        version=__version__,
        description="Send batches of transactional push and in-app messages through "
        'API-trigger campaigns. Every non-200 answer is `{"error_message": "..."}`.',
    )
    install_error_handlers(app)
    app.include_router(devices.router)

    @app.get("/health", tags=["health"])
    async def read_health() -> JSONResponse:
        """The state of the database and of the Prefect server."""
        database = _database_ok()
        prefect = await _prefect_ok()
        body: dict[str, Any] = {
            "status": "ok" if database else "degraded",
            "database": "ok" if database else "unreachable",
            "prefect": "ok" if prefect else "unreachable",
            "version": __version__,
        }
        return JSONResponse(body, status_code=200 if database else 503)

    return app
