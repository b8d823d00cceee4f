"""The one place that maps errors to HTTP: every non-200 answer is ``{"error_message": ...}``.

Domain errors (:mod:`campaign_trigger.errors`) carry their status; FastAPI's
validation errors become 400s (documented as such: the 422 entries are removed from
the OpenAPI page); unknown routes and wrong methods keep their 404/405; the scheduler
or the database out of reach (or the database busy past its timeout) a 503 with
``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from campaign_trigger.api.observability import note_refusal, reason_of
from campaign_trigger.errors import CampaignTriggerError, TooManyRequests
from campaign_trigger.schemas.text import printable

log = logging.getLogger(__name__)

REF_TEMPLATE = "#/components/schemas/{model}"
SCHEDULER_DOWN = "The scheduler (Prefect) cannot be reached right now; please retry"
DATABASE_DOWN = "The database cannot be reached or is busy right now; please retry"

_HTTP_MESSAGES = {
    404: "Not found",
    405: "Method not allowed",
}


def error_response(
    status_code: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The contract's error body. A message echoing the caller's input may hold a lone
    surrogate (from a JSON escape): it is replaced, so the answer is always UTF-8."""
    return JSONResponse(
        {"error_message": printable(message)}, status_code=status_code, headers=headers
    )


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body",)]
    where = location[-1] if location else ""
    kind = location[0] if location else ""
    what = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return "Malformed JSON body"
    if kind in ("query", "path", "header") and where:
        return f"Invalid {kind} parameter '{where}': {what}"
    if where:
        return f"Invalid body member '{'.'.join(location)}': {what}"
    return f"Invalid request: {what}"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the contract's error body."""

    @app.exception_handler(CampaignTriggerError)
    async def _domain(request: Request, exc: CampaignTriggerError) -> JSONResponse:
        note_refusal(request, reason_of(exc))
        headers = None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(exc.retry_after_seconds)}
        return error_response(exc.status_code, exc.message, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = _HTTP_MESSAGES.get(exc.status_code) or (
            exc.detail if isinstance(exc.detail, str) else "Request refused"
        )
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        note_refusal(request, "invalid_input")
        return error_response(400, _validation_message(exc))

    @app.exception_handler(httpx.HTTPError)
    async def _scheduler_down(request: Request, exc: httpx.HTTPError) -> JSONResponse:
        note_refusal(request, "scheduler_unavailable")
        log.warning("Prefect unreachable: %r", exc)
        return error_response(503, SCHEDULER_DOWN, {"Retry-After": "5"})

    @app.exception_handler(OperationalError)
    async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
        # Unreachable, or busy past its timeout (SQLite's write lock held by a frozen
        # worker, docs/architecture.md): the caller's retry is the answer, not a 500.
        note_refusal(request, "database_unavailable")
        log.warning("database unavailable: %r", exc.orig)
        return error_response(503, DATABASE_DOWN, {"Retry-After": "5"})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        note_refusal(request, "internal_error")
        log.exception("unhandled error", exc_info=exc)
        # sent from outside the middleware stack: its security headers are set here
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
        return error_response(500, "Internal server error", headers)


def customise_openapi(app: FastAPI, *, extra_models: Sequence[type[BaseModel]] = ()) -> None:
    """Document 400 (our validation answer) instead of FastAPI's default 422, and add
    the models that hand-read bodies refer to (``#/components/schemas/<Model>``)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": "Invalid parameters",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ErrorBody"}
                            }
                        },
                    }
        components = schema.get("components", {}).get("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        for model in extra_models:
            definition = model.model_json_schema(ref_template=REF_TEMPLATE)
            for name, nested in definition.pop("$defs", {}).items():
                components.setdefault(name, nested)
            components.setdefault(model.__name__, definition)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
