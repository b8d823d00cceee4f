"""The one exception tree of campaign-trigger.

Services, tasks and the CLI raise these; the API maps them to HTTP in one place
(``api/errors.py``) and the CLI prints their message. ``message`` is the text
users see, verbatim from the spec where the spec has one::

    CampaignTriggerError
    ├── InvalidInput            400: the request is wrong (spec §7 messages)
    │   ├── CampaignNotFound        unknown campaign (or another org's)
    │   ├── CampaignNotReady        draft or ended campaign
    │   ├── RequestNotFound         unknown request (or another org's)
    │   └── RequestStateError       cancel/report refused by the request's state
    ├── Unauthenticated         401: missing, bad, expired or revoked token
    ├── Forbidden               403: the role may not act
    ├── PayloadTooLarge         413: body or upload over the limit
    ├── TooManyRequests         429, with the seconds to wait (Retry-After)
    │   ├── QuotaExceeded           the subscription's request quota is spent
    │   └── SignInThrottled         too many failed sign-ins for the account or address
    ├── Conflict                409: e.g. an idempotency key reused with another body
    ├── ServiceUnavailable      503: a part the call needs is missing (nothing was done)
    ├── ReportWaitFailed        send_batch(wait=True): stored and scheduled, the wait failed
    └── AdminError              a refused admin command (CLI)
"""

from __future__ import annotations


class CampaignTriggerError(Exception):
    """Base of every error the service raises on purpose."""

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(CampaignTriggerError):
    """The caller's input is wrong; the message says how."""


class CampaignNotFound(InvalidInput):
    """No such campaign for this organisation."""


class CampaignNotReady(InvalidInput):
    """The campaign is a draft or has ended."""


class RequestNotFound(InvalidInput):
    """No such request for this organisation."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"The request {request_id} was not found")
        self.request_id = request_id


class RequestStateError(InvalidInput):
    """The request's state refuses the action (already cancelled, not processed...)."""


class Unauthenticated(CampaignTriggerError):
    """Missing, malformed, forged, expired or revoked credentials."""

    status_code = 401


class Forbidden(CampaignTriggerError):
    """Authenticated, but the role may not do this."""

    status_code = 403


class PayloadTooLarge(CampaignTriggerError):
    """The body or upload is larger than allowed."""

    status_code = 413


class TooManyRequests(CampaignTriggerError):
    """Refused for now; ``retry_after_seconds`` says when to try again."""

    status_code = 429

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class QuotaExceeded(TooManyRequests):
    """The organisation's request quota for the period is spent."""


class SignInThrottled(TooManyRequests):
    """Too many failed sign-ins for this account or from this address, lately."""


class Conflict(CampaignTriggerError):
    """The request conflicts with an earlier one."""

    status_code = 409


class ServiceUnavailable(CampaignTriggerError):
    """A part the call needs is missing or down; nothing was done."""

    status_code = 503


class ReportWaitFailed(CampaignTriggerError):
    """A batch was stored and scheduled, but waiting for its report failed: the message
    names the request, which must not be sent again."""

    status_code = 503


class AdminError(CampaignTriggerError):
    """An admin command refused its input; nothing was changed."""
