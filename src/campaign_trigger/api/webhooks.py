"""Completion webhooks: register, list and remove an organisation's endpoints, and list
each one's delivery attempts. Owners and admins only (403 for other roles); errors as
everywhere, ``{"error_message": ...}``. See ``docs/webhooks.md``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response
from starlette.status import HTTP_204_NO_CONTENT

from campaign_trigger.api.deps import CurrentAccount, SessionDep, SettingsDep
from campaign_trigger.api.responses import errors
from campaign_trigger.schemas.webhooks import (
    WebhookAttemptOut,
    WebhookAttempts,
    WebhookCreate,
    WebhookList,
    WebhookPublic,
    WebhookRegistered,
)
from campaign_trigger.services import webhooks
from campaign_trigger.services.auth import Identity


def manager_identity(identity: CurrentAccount) -> Identity:
    """The caller, if its role may manage webhooks (403 otherwise)."""
    webhooks.require_manager(identity)
    return identity


Manager = Annotated[Identity, Depends(manager_identity)]
WebhookId = Annotated[str, Path(max_length=64, description="The endpoint's id (`whk_...`).")]

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"], responses=errors(400, 401, 403))


@router.post("", response_model=WebhookRegistered)
def create_webhook(
    body: WebhookCreate, identity: Manager, session: SessionDep, settings: SettingsDep
) -> WebhookRegistered:
    """Register an endpoint for the organisation's completion events; answers its signing
    secret, this once."""
    registered = webhooks.register(
        session=session, settings=settings, org_id=identity.org_id, url=body.url
    )
    endpoint = registered.endpoint
    return WebhookRegistered(
        id=endpoint.id, url=endpoint.url, created_at=endpoint.created_at, secret=registered.secret
    )


@router.get("", response_model=WebhookList)
def read_webhooks(identity: Manager, session: SessionDep) -> WebhookList:
    """The organisation's endpoints, oldest first."""
    return WebhookList(
        webhooks=[
            WebhookPublic(id=e.id, url=e.url, created_at=e.created_at)
            for e in webhooks.endpoints(session=session, org_id=identity.org_id)
        ]
    )


@router.delete(
    "/{webhook_id}",
    status_code=HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={204: {"description": "Removed, with its pending events and attempts"}},
)
def delete_webhook(webhook_id: WebhookId, identity: Manager, session: SessionDep) -> Response:
    """Remove an endpoint: no more events are sent to it."""
    webhooks.remove(session=session, org_id=identity.org_id, endpoint_id=webhook_id)
    return Response(status_code=HTTP_204_NO_CONTENT)


@router.get("/{webhook_id}/attempts", response_model=WebhookAttempts)
def read_webhook_attempts(
    webhook_id: WebhookId,
    identity: Manager,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> WebhookAttempts:
    """The endpoint's delivery attempts, newest first: when, the status or the error,
    how long it took."""
    found = webhooks.attempts(
        session=session,
        org_id=identity.org_id,
        endpoint_id=webhook_id,
        limit=limit,
        offset=offset,
    )
    return WebhookAttempts(
        attempts=[
            WebhookAttemptOut(
                event_id=a.event_id,
                event_type=a.event_type,
                request_id=a.request_id,
                attempted_at=a.attempted_at,
                status_code=a.status_code,
                error=a.error,
                duration_ms=a.duration_ms,
            )
            for a in found
        ]
    )
