"""The one place that maps errors to HTTP: every non-200 answer is ``{"error_message": ...}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from campaign_trigger.errors import CampaignTriggerError, QuotaExceeded

log = logging.getLogger(__name__)


def error_response(
    status_code: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error_message": message}, status_code=status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the contract's error body."""

    @app.exception_handler(CampaignTriggerError)
    async def _domain(_: Request, exc: CampaignTriggerError) -> JSONResponse:
        headers = None
        if isinstance(exc, QuotaExceeded):
            headers = {"Retry-After": str(exc.retry_after_seconds)}
        return error_response(exc.status_code, exc.message, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "Request refused"
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"Invalid request: {where}: {first.get('msg', 'invalid')}".replace(": :", ":")
        return error_response(400, message)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "Internal server error")
