"""A Python client of the campaign-trigger HTTP API (``spec/trigger-api.md``), on httpx.

Two flavours with the same methods: :class:`TriggerClient` (blocking) and
:class:`AsyncTriggerClient` (``await`` every call)::

    with TriggerClient("http://127.0.0.1:8000") as api:
        api.sign_in("demo@example.com", password)
        created = api.create("demo-campaign", messages=[Message(user_id="user-1")])
        api.report(created.request_id).reports      # links, once processed

A CSV file is streamed as multipart form-data (never read whole into memory).
Pass ``transport=`` to swap the network, e.g. ``httpx.MockTransport`` in tests.

Every refusal (any status but 2xx) raises one exception of this tree, carrying the
server's ``error_message`` and the HTTP ``status_code``::

    TriggerAPIError             any refused call
    ├── BadRequest              400: the spec's messages (unknown campaign, bad CSV...)
    ├── AuthError               401: missing, bad, expired or revoked token / credentials
    ├── ForbiddenError          403: the account's role may not do this
    ├── ConflictError           409: an idempotency key reused with another body
    ├── PayloadTooLargeError    413: upload over the limit
    ├── QuotaError              429: the request quota is spent (``retry_after`` seconds)
    └── ServerError             5xx

Network failures are httpx's own exceptions (``httpx.TransportError``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AsyncTriggerClient",
    "AuthError",
    "BadRequest",
    "ConflictError",
    "CreatedRequest",
    "ForbiddenError",
    "Message",
    "PayloadTooLargeError",
    "QuotaError",
    "Report",
    "RequestInfo",
    "ScheduledPage",
    "ServerError",
    "TriggerAPIError",
    "TriggerClient",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


# --- errors -------------------------------------------------------------------------


class TriggerAPIError(Exception):
    """The API refused a call; ``error_message`` is its text, ``status_code`` its status."""

    def __init__(self, error_message: str, *, status_code: int) -> None:
        super().__init__(f"{status_code}: {error_message}")
        self.error_message = error_message
        self.status_code = status_code


class BadRequest(TriggerAPIError):
    """400: the input is wrong (the spec's error messages)."""


class AuthError(TriggerAPIError):
    """401: missing, malformed, expired or revoked token, or wrong credentials."""


class ForbiddenError(TriggerAPIError):
    """403: authenticated, but the role may not act."""


class ConflictError(TriggerAPIError):
    """409: the call conflicts with an earlier one (an idempotency key reused)."""


class PayloadTooLargeError(TriggerAPIError):
    """413: the upload is over the server's limit."""


class QuotaError(TriggerAPIError):
    """429: the subscription's request quota is spent; retry after ``retry_after`` seconds."""

    def __init__(self, error_message: str, *, status_code: int, retry_after: int | None) -> None:
        super().__init__(error_message, status_code=status_code)
        self.retry_after = retry_after


class ServerError(TriggerAPIError):
    """5xx: the server failed."""


_ERRORS: dict[int, type[TriggerAPIError]] = {
    400: BadRequest,
    401: AuthError,
    403: ForbiddenError,
    409: ConflictError,
    413: PayloadTooLargeError,
}


def _error_for(response: httpx.Response) -> TriggerAPIError:
    try:
        body = response.json()
        message = str(body["error_message"]) if isinstance(body, dict) else response.text
    except (ValueError, KeyError):
        message = response.text or response.reason_phrase
    status = response.status_code
    if status == 429:
        retry_after = response.headers.get("Retry-After", "")
        return QuotaError(
            message,
            status_code=status,
            retry_after=int(retry_after) if retry_after.isdigit() else None,
        )
    if status >= 500:
        return ServerError(message, status_code=status)
    return _ERRORS.get(status, TriggerAPIError)(message, status_code=status)


# --- results ------------------------------------------------------------------------


class Message(BaseModel):
    """One message: the user and their template variables."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    template_variables: dict[str, Any] = Field(default_factory=dict)


class CreatedRequest(BaseModel):
    """The answer to a create: the new request's id."""

    request_id: str


class RequestInfo(BaseModel):
    """A request as created: its messages, or a signed link to its message file (CSV)."""

    request_id: str
    campaign_id: str
    requested_at: datetime = Field(description="Timezone-aware (UTC).")
    to_be_send_at: datetime = Field(description="Timezone-aware (UTC).")
    messages: list[Message] | str

    @property
    def messages_url(self) -> str | None:
        """The link to the message file of a CSV request (None for a JSON request)."""
        return self.messages if isinstance(self.messages, str) else None


class ScheduledPage(BaseModel):
    """One page of a campaign's scheduled requests; ``total`` counts every page."""

    campaign_id: str
    requests: list[RequestInfo]
    total: int | None = None


class Report(BaseModel):
    """Links to the CSV report files of a processed request (valid one hour)."""

    request_id: str
    reports: list[str]


# --- building calls and reading answers (shared by both clients) ---------------------

MessagesArg = Sequence[Message | Mapping[str, Any]]


def _send_at_text(send_at: datetime | str | None) -> str | None:
    if send_at is None or isinstance(send_at, str):
        return send_at
    if send_at.tzinfo is None:
        raise ValueError("send_at must be timezone-aware")
    return send_at.isoformat(timespec="seconds")


def _message_json(message: Message | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(message, Message):
        return message.model_dump()
    return dict(message)


@dataclass
class _Call:
    """One HTTP call: how to build it, and the files to close once it is sent."""

    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def _create_call(
    campaign_id: str,
    *,
    messages: MessagesArg | None,
    csv_path: str | PathLike[str] | None,
    send_at: datetime | str | None,
    idempotency_key: str | None,
    files: ExitStack,
) -> _Call:
    if (messages is None) == (csv_path is None):
        raise ValueError("give exactly one of messages or csv_path")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    when = _send_at_text(send_at)
    if messages is not None:
        body: dict[str, Any] = {
            "campaign_id": campaign_id,
            "messages": [_message_json(m) for m in messages],
        }
        if when is not None:
            body["send_at"] = when
        return _Call("POST", "/api/campaigns/trigger", {"json": body, "headers": headers})
    assert csv_path is not None
    path = Path(csv_path)
    handle = files.enter_context(path.open("rb"))
    form = {"campaign_id": campaign_id, **({"send_at": when} if when is not None else {})}
    return _Call(
        "POST",
        "/api/campaigns/trigger",
        {"data": form, "files": {"file": (path.name, handle, "text/csv")}, "headers": headers},
    )


def _scheduled_call(campaign_id: str, *, limit: int | None, offset: int | None) -> _Call:
    params = {
        name: value for name, value in (("limit", limit), ("offset", offset)) if value is not None
    }
    return _Call(
        "GET", f"/api/campaigns/{_segment(campaign_id)}/request/scheduled", {"params": params}
    )


def _segment(value: str) -> str:
    """A path segment, percent-encoded (ids are user input)."""
    from urllib.parse import quote

    return quote(value, safe="")


def _checked(response: httpx.Response) -> httpx.Response:
    if not response.is_success:  # 200, or 204 for sign-out
        raise _error_for(response)
    return response


def _token_from(response: httpx.Response) -> str:
    token = response.headers.get("Authorization", "")
    if not token:
        raise AuthError("The sign-in answer carried no token", status_code=response.status_code)
    return token if token.lower().startswith("bearer ") else f"Bearer {token}"


def _scheduled_page(response: httpx.Response) -> ScheduledPage:
    body = response.json()
    campaign_id = body["campaign_id"]
    total = response.headers.get("X-Total-Count", "")
    return ScheduledPage(
        campaign_id=campaign_id,
        requests=[RequestInfo(campaign_id=campaign_id, **entry) for entry in body["requests"]],
        total=int(total) if total.isdigit() else None,
    )


def _cancelled(response: httpx.Response) -> RequestInfo:
    body = dict(response.json())
    if "messages" not in body and "Messages" in body:  # the spec's sample spells it so
        body["messages"] = body.pop("Messages")
    return RequestInfo.model_validate(body)


# --- the clients --------------------------------------------------------------------


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

    def _send(self, call: _Call) -> httpx.Response:
        return _checked(self._http.request(call.method, call.path, **call.kwargs))

    def sign_in(self, email: str, password: str) -> str:
        """Sign in; keeps the token for the next calls and returns it."""
        self.token = None
        response = self._send(
            _Call(
                "POST", "/users/sign_in", {"json": {"user": {"email": email, "password": password}}}
            )
        )
        self.token = _token_from(response)
        return self.token

    def sign_out(self) -> None:
        """Revoke the current token."""
        self._send(_Call("DELETE", "/users/sign_out"))
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
            call = _create_call(
                campaign_id,
                messages=messages,
                csv_path=csv_path,
                send_at=send_at,
                idempotency_key=idempotency_key,
                files=files,
            )
            return CreatedRequest.model_validate(self._send(call).json())

    def cancel(self, request_id: str) -> RequestInfo:
        """Cancel a request that has not started; returns it as created."""
        call = _Call("PUT", f"/api/campaigns/request/{_segment(request_id)}/cancel")
        return _cancelled(self._send(call))

    def scheduled(
        self, campaign_id: str, *, limit: int | None = None, offset: int | None = None
    ) -> ScheduledPage:
        """One page of the campaign's requests that have not started yet."""
        return _scheduled_page(self._send(_scheduled_call(campaign_id, limit=limit, offset=offset)))

    def report(self, request_id: str) -> Report:
        """The report links of a processed request."""
        call = _Call("GET", "/api/campaigns/report", {"params": {"request_id": request_id}})
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
                raise _error_for(response)
            yield response
        finally:
            response.close()


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

    async def _send(self, call: _Call) -> httpx.Response:
        return _checked(await self._http.request(call.method, call.path, **call.kwargs))

    async def sign_in(self, email: str, password: str) -> str:
        """Sign in; keeps the token for the next calls and returns it."""
        self.token = None
        response = await self._send(
            _Call(
                "POST", "/users/sign_in", {"json": {"user": {"email": email, "password": password}}}
            )
        )
        self.token = _token_from(response)
        return self.token

    async def sign_out(self) -> None:
        """Revoke the current token."""
        await self._send(_Call("DELETE", "/users/sign_out"))
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
            call = _create_call(
                campaign_id,
                messages=messages,
                csv_path=csv_path,
                send_at=send_at,
                idempotency_key=idempotency_key,
                files=files,
            )
            return CreatedRequest.model_validate((await self._send(call)).json())

    async def cancel(self, request_id: str) -> RequestInfo:
        """Cancel a request that has not started; returns it as created."""
        call = _Call("PUT", f"/api/campaigns/request/{_segment(request_id)}/cancel")
        return _cancelled(await self._send(call))

    async def scheduled(
        self, campaign_id: str, *, limit: int | None = None, offset: int | None = None
    ) -> ScheduledPage:
        """One page of the campaign's requests that have not started yet."""
        call = _scheduled_call(campaign_id, limit=limit, offset=offset)
        return _scheduled_page(await self._send(call))

    async def report(self, request_id: str) -> Report:
        """The report links of a processed request."""
        call = _Call("GET", "/api/campaigns/report", {"params": {"request_id": request_id}})
        return Report.model_validate((await self._send(call)).json())
