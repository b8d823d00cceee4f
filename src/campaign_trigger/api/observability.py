"""What an operator sees of the API: ``GET /metrics``, the request id of every call, and the
count of creates accepted and refused.

:class:`ObservabilityMiddleware` (pure ASGI, outermost) gives each call a request id —
the caller's ``X-Request-ID`` when it is a sane one, else a new one — that every log
line written for the call carries and the answer echoes. It also counts the answers of
``POST /api/campaigns/trigger``: 200 accepted, anything else refused, by the reason the
error handlers left in the request's state (:func:`note_refusal`), else by status.
"""

from __future__ import annotations

import re
import uuid
from typing import Final

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from campaign_trigger import logs, metrics

REQUEST_ID_HEADER: Final = "X-Request-ID"
TRIGGER_PATH: Final = "/api/campaigns/trigger"
REFUSAL_STATE_KEY: Final = "refusal_reason"
_SANE_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_BY_STATUS: Final = {
    400: "invalid_input",
    401: "unauthenticated",
    403: "forbidden",
    409: "conflict",
    413: "payload_too_large",
    429: "too_many_requests",
    503: "service_unavailable",
}


def reason_of(error: BaseException) -> str:
    """A refusal's reason label: its error class in snake case (``CampaignNotFound`` ->
    ``campaign_not_found``): a small, fixed set, unlike the messages."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


def note_refusal(request: Request, reason: str) -> None:
    """Tell the middleware why this call is refused (the error handlers call it)."""
    setattr(request.state, REFUSAL_STATE_KEY, reason)


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = str(value.decode("latin-1"))
            if _SANE_ID.fullmatch(given):
                return given
    return uuid.uuid4().hex


class ObservabilityMiddleware:
    """The request id of each call, and the counts of the trigger route's answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        identifier = _request_id(scope)
        is_trigger = scope.get("method") == "POST" and scope.get("path") == TRIGGER_PATH
        state = scope.setdefault("state", {})

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-request-id", identifier.encode())]
                message = {**message, "headers": headers}
                if is_trigger:
                    _count(message["status"], state.get(REFUSAL_STATE_KEY))
            await send(message)

        with logs.about_request(identifier):
            await self.app(scope, receive, send_with_id)


def _count(status: int, reason: str | None) -> None:
    if status == 200:
        metrics.REQUESTS_ACCEPTED.inc()
    else:
        metrics.REQUESTS_REFUSED.labels(reason or _BY_STATUS.get(status, f"http_{status}")).inc()


def install_observability(app: FastAPI) -> None:
    """Add ``GET /metrics``."""

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    )
    def read_metrics() -> Response:
        """This API process's metrics in Prometheus text format: creates accepted and
        refused (by reason), quota refusals, the outbox depth, process figures."""
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE_LATEST)
