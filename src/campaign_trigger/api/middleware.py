"""ASGI middleware: the remaining request quota on every answer of a quota-counted route.

The quota dependency leaves the figure in the request's state; this adds the
``X-Quota-Remaining`` header to the response, error answers included. Pure ASGI
(no body buffering), so uploads still stream.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from campaign_trigger.api.deps import QUOTA_STATE_KEY

QUOTA_HEADER = "X-Quota-Remaining"


class QuotaHeaderMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_quota(message: Message) -> None:
            if message["type"] == "http.response.start" and QUOTA_STATE_KEY in state:
                headers = list(message.get("headers", []))
                value = str(state[QUOTA_STATE_KEY]).encode()
                headers.append((QUOTA_HEADER.lower().encode(), value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_quota)
