"""The asyncio client, :class:`AsyncTriggerClient` (``await`` every call)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from datetime import datetime
from os import PathLike
from types import TracebackType
from typing import Self

import httpx

from campaign_trigger.client import calls
from campaign_trigger.client.calls import DEFAULT_BASE_URL, DEFAULT_TIMEOUT, MessagesArg
from campaign_trigger.client.errors import error_for
from campaign_trigger.client.models import CreatedRequest, Report, RequestInfo, ScheduledPage
from campaign_trigger.schemas.preview import TriggerPreview


class AsyncTriggerClient:
    """Asynchronous client: the methods of :class:`TriggerClient`, awaited."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            timeout=timeout,
            headers={"Accept": "application/json"},
        )
        self.token = token

    @property
    def token(self) -> str | None:
        """The ``Bearer ...`` value sent in ``Authorization`` (set by :meth:`sign_in`)."""
        token: str | None = self._http.headers.get("Authorization")
        return token

    @token.setter
    def token(self, value: str | None) -> None:
        if value is None:
            self._http.headers.pop("Authorization", None)
        else:
            self._http.headers["Authorization"] = value

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: calls.Call) -> httpx.Response:
        return calls.checked(await self._http.request(call.method, call.path, **call.kwargs))

    async def sign_in(self, email: str, password: str) -> str:
        """Sign in; keeps the token for the next calls and returns it."""
        self.token = None
        response = await self._send(
            calls.Call(
                "POST", "/users/sign_in", {"json": {"user": {"email": email, "password": password}}}
            )
        )
        self.token = calls.token_from(response)
        return self.token

    async def sign_out(self) -> None:
        """Revoke the current token."""
        await self._send(calls.Call("DELETE", "/users/sign_out"))
        self.token = None

    async def create(
        self,
        campaign_id: str,
        *,
        messages: MessagesArg | None = None,
        csv_path: str | PathLike[str] | None = None,
        send_at: datetime | str | None = None,
        idempotency_key: str | None = None,
    ) -> CreatedRequest:
        """Create a request from JSON ``messages`` or a streamed CSV file, sent at ``send_at``."""
        with ExitStack() as files:
            call = calls.create_call(
                campaign_id,
                messages=messages,
                csv_path=csv_path,
                send_at=send_at,
                idempotency_key=idempotency_key,
                files=files,
            )
            return CreatedRequest.model_validate((await self._send(call)).json())

    async def preview(
        self,
        campaign_id: str,
        *,
        messages: MessagesArg | None = None,
        csv_path: str | PathLike[str] | None = None,
        send_at: datetime | str | None = None,
    ) -> TriggerPreview:
        """What :meth:`create` would send (``?dry_run=true``): the same checks and errors,
        nothing stored, scheduled or sent; takes one unit of the quota."""
        with ExitStack() as files:
            call = calls.create_call(
                campaign_id,
                messages=messages,
                csv_path=csv_path,
                send_at=send_at,
                idempotency_key=None,
                files=files,
                dry_run=True,
            )
            return TriggerPreview.model_validate((await self._send(call)).json())

    async def cancel(self, request_id: str) -> RequestInfo:
        """Cancel a request that has not started; returns it as created."""
        call = calls.Call("PUT", f"/api/campaigns/request/{calls.segment(request_id)}/cancel")
        return calls.cancelled(await self._send(call))

    async def scheduled(
        self,
        campaign_id: str,
        *,
        limit: int | None = None,
        offset: int | None = None,
        after: str | None = None,
    ) -> ScheduledPage:
        """One page of the campaign's requests that have not started yet (``after``: the
        last request id of the page before, for pages that do not shift)."""
        call = calls.scheduled_call(campaign_id, limit=limit, offset=offset, after=after)
        return calls.scheduled_page(await self._send(call))

    async def report(self, request_id: str) -> Report:
        """The report links of a processed request."""
        call = calls.Call("GET", "/api/campaigns/report", {"params": {"request_id": request_id}})
        return Report.model_validate((await self._send(call)).json())

    @asynccontextmanager
    async def download(self, link: str) -> AsyncIterator[httpx.Response]:
        """Stream one report file (``response.aiter_lines()``); links need no token."""
        request = self._http.build_request("GET", link)
        request.headers.pop("Authorization", None)  # the link is its own credential
        response = await self._http.send(request, stream=True)
        try:
            if response.status_code != 200:
                await response.aread()
                raise error_for(response)
            yield response
        finally:
            await response.aclose()
