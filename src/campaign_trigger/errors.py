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
    ├── PayloadTooLarge         413: upload over the limit
    ├── QuotaExceeded           429: the subscription's request quota is spent
    ├── Conflict                409: e.g. an idempotency key reused with another body
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
    """The upload is larger than allowed."""

    status_code = 413


class QuotaExceeded(CampaignTriggerError):
    """The organisation's request quota for the period is spent."""

    status_code = 429

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Conflict(CampaignTriggerError):
    """The request conflicts with an earlier one."""

    status_code = 409


class AdminError(CampaignTriggerError):
    """An admin command refused its input; nothing was changed."""
