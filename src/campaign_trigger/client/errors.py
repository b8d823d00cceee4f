"""The client's exception tree: one class per refused status (see the package docstring)."""

from __future__ import annotations

import httpx


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
    """413: the body or upload is over the server's limit."""


class QuotaError(TriggerAPIError):
    """429: the subscription's request quota is spent, or too many sign-ins failed for the
    account or address lately; retry after ``retry_after`` seconds."""

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


def error_for(response: httpx.Response) -> TriggerAPIError:
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
