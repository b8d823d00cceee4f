"""The blocking client, :class:`TriggerClient`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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


class TriggerClient:
    """Blocking client. Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
    ) -> None:
        self._http = httpx.Client(
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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: calls.Call) -> httpx.Response:
        return calls.checked(self._http.request(call.method, call.path, **call.kwargs))

    def sign_in(self, email: str, password: str) -> str:
        """Sign in; keeps the token for the next calls and returns it."""
        self.token = None
        response = self._send(
            calls.Call(
                "POST", "/users/sign_in", {"json": {"user": {"email": email, "password": password}}}
            )
        )
        self.token = calls.token_from(response)
        return self.token

    def sign_out(self) -> None:
        """Revoke the current token."""
        self._send(calls.Call("DELETE", "/users/sign_out"))
        self.token = None

    def create(
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
            return CreatedRequest.model_validate(self._send(call).json())

    def preview(
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
            return TriggerPreview.model_validate(self._send(call).json())

    def cancel(self, request_id: str) -> RequestInfo:
        """Cancel a request that has not started; returns it as created."""
        call = calls.Call("PUT", f"/api/campaigns/request/{calls.segment(request_id)}/cancel")
        return calls.cancelled(self._send(call))

    def scheduled(
        self,
        campaign_id: str,
        *,
        limit: int | None = None,
        offset: int | None = None,
        after: str | None = None,
    ) -> ScheduledPage:
        """One page of the campaign's requests that have not started yet (``after``: the
        last request id of the page before, for pages that do not shift)."""
        return calls.scheduled_page(
            self._send(calls.scheduled_call(campaign_id, limit=limit, offset=offset, after=after))
        )

    def report(self, request_id: str) -> Report:
        """The report links of a processed request."""
        call = calls.Call("GET", "/api/campaigns/report", {"params": {"request_id": request_id}})
        return Report.model_validate(self._send(call).json())

    @contextmanager
    def download(self, link: str) -> Iterator[httpx.Response]:
        """Stream one report file (``response.iter_lines()``); links need no token."""
        request = self._http.build_request("GET", link)
        request.headers.pop("Authorization", None)  # the link is its own credential
        response = self._http.send(request, stream=True)
        try:
            if response.status_code != 200:
                response.read()
                raise error_for(response)
            yield response
        finally:
            response.close()
