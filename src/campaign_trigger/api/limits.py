"""Request body limits, enforced while the body streams in: before it is parsed and
before the caller is authenticated.

Each route has a budget (:func:`body_limit`): a few KB for sign-in and the device
routes, a JSON create sized from ``json_messages_cap``, the upload limit for a CSV
upload. A declared ``Content-Length`` over the budget is answered 413 at once, with
nothing read; a body without one (chunked) is counted as it arrives and answered 413
as soon as it passes the budget. Pure ASGI: nothing is buffered here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from campaign_trigger.api.errors import error_response
from campaign_trigger.config import Settings, get_settings

KB: Final = 1024
SIGN_IN_BYTES: Final = 4 * KB
DEVICE_BYTES: Final = 8 * KB
OTHER_BYTES: Final = 64 * KB
JSON_OVERHEAD_BYTES: Final = 64 * KB
TRIGGER_PATH: Final = "/api/campaigns/trigger"

TOO_LARGE: Final = "The request body is larger than the {} bytes allowed"
JSON_TOO_LARGE: Final = (
    "The JSON body is larger than the {} bytes allowed (at most {} messages per JSON "
    "call); send the messages as a CSV file (multipart/form-data, form key 'file')"
)
UPLOAD_TOO_LARGE: Final = "The file is larger than the {} bytes allowed"


def json_body_limit(settings: Settings) -> int:
    """Bytes allowed for a JSON create: ``json_message_bytes`` per message of the cap."""
    return JSON_OVERHEAD_BYTES + settings.json_messages_cap * settings.json_message_bytes


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """A route's body budget and the message of its 413."""

    max_bytes: int
    message: str


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _media_type(scope: Scope) -> str:
    return (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()


def body_limit(scope: Scope, settings: Settings) -> BodyLimit:
    """The budget of the route ``scope`` names."""
    path: str = scope.get("path", "")
    if path.startswith("/users/"):
        return BodyLimit(SIGN_IN_BYTES, TOO_LARGE.format(SIGN_IN_BYTES))
    if path.startswith(("/api/apps/", "/api/inapp/")):
        return BodyLimit(DEVICE_BYTES, TOO_LARGE.format(DEVICE_BYTES))
    if path == TRIGGER_PATH:
        kind = _media_type(scope)
        if kind == "application/json" or kind.endswith("+json"):
            limit = json_body_limit(settings)
            return BodyLimit(limit, JSON_TOO_LARGE.format(limit, settings.json_messages_cap))
        # multipart (the CSV file) or a refused plain body, which is never read
        limit = settings.max_upload_bytes
        return BodyLimit(limit, UPLOAD_TOO_LARGE.format(limit))
    return BodyLimit(OTHER_BYTES, TOO_LARGE.format(OTHER_BYTES))


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when the body passes its budget (FastAPI re-raises it)."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=413, detail=message)


def _declared_length(scope: Scope) -> int | None:
    text = (_header(scope, b"content-length") or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


class BodyLimitMiddleware:
    """Refuses bodies over their route's budget (413) before the route reads them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope, get_settings())
        declared = _declared_length(scope)
        if declared is not None and declared > limit.max_bytes:
            await error_response(413, limit.message)(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.max_bytes:
                    raise BodyTooLarge(limit.message)
            return message

        await self.app(scope, counted_receive, send)
