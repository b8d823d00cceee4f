"""A Python client of the campaign-trigger HTTP API (``spec/trigger-api.md``), on httpx.

Two flavours with the same methods: :class:`TriggerClient` (blocking) and
:class:`AsyncTriggerClient` (``await`` every call)::

    with TriggerClient("http://127.0.0.1:8000") as api:
        api.sign_in("demo@example.com", password)
        created = api.create("demo-campaign", messages=[Message(user_id="user-1")])
        api.report(created.request_id).reports      # links, once processed
        api.preview("demo-campaign", messages=[...])  # a dry run: what would be sent

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
    ├── QuotaError              429: the request quota is spent, or sign-in is throttled
    │                               after failures (``retry_after`` seconds)
    └── ServerError             5xx

Network failures are httpx's own exceptions (``httpx.TransportError``).

:func:`verify_signature` checks a completion webhook's ``Campaign-Trigger-Signature``
(``docs/webhooks.md``).
"""

from __future__ import annotations

from campaign_trigger.client.async_client import AsyncTriggerClient
from campaign_trigger.client.errors import (
    AuthError,
    BadRequest,
    ConflictError,
    ForbiddenError,
    PayloadTooLargeError,
    QuotaError,
    ServerError,
    TriggerAPIError,
)
from campaign_trigger.client.models import CreatedRequest, Report, RequestInfo, ScheduledPage
from campaign_trigger.client.sync_client import TriggerClient
from campaign_trigger.client.webhooks import SIGNATURE_HEADER, verify_signature
from campaign_trigger.schemas.api import Message
from campaign_trigger.schemas.preview import TriggerPreview

__all__ = [
    "SIGNATURE_HEADER",
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
    "TriggerPreview",
    "verify_signature",
]
