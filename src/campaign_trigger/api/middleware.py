"""ASGI middleware: the headers of every answer (security, caching, remaining quota)."""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from campaign_trigger.api.deps import QUOTA_STATE_KEY

QUOTA_HEADER = "X-Quota-Remaining"
SECURITY_HEADERS: Final = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
NO_STORE: Final = b"no-store"
STATIC_CACHE: Final = b"public, max-age=86400"


class ResponseHeadersMiddleware:
    """Every answer's headers, in one place (pure ASGI: no body buffering, so uploads
    still stream):

    * ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``;
    * ``Cache-Control: no-store`` unless the route chose otherwise (answers carry tokens,
      device secrets, messages and signed files), but for the documentation assets
      under ``/static/``, which may be cached for a day;
    * ``X-Quota-Remaining`` on the answers of quota-counted routes, error answers
      included (the quota dependency leaves the figure in the request's state).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        cache = STATIC_CACHE if scope.get("path", "").startswith("/static/") else NO_STORE

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {bytes(name).lower() for name, _ in headers}
                headers += [h for h in SECURITY_HEADERS if h[0] not in present]
                if b"cache-control" not in present:
                    headers.append((b"cache-control", cache))
                if QUOTA_STATE_KEY in state:
                    remaining = str(state[QUOTA_STATE_KEY]).encode()
                    headers.append((QUOTA_HEADER.lower().encode(), remaining))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
