"""Dependencies of the routes, as ``Annotated`` aliases: handlers read like sentences.

``SessionDep`` is the API's one way to the database: one session per call, committed
when the handler returns and before the answer leaves (``scope="function"``), rolled
back when it raises. ``CurrentAccount`` authenticates; ``QuotaAccount`` also takes one
unit of the organisation's request quota (committed at once, so refused calls count
too); ``Sender`` further requires a role that may create and cancel requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from campaign_trigger import metrics
from campaign_trigger.config import Settings, get_settings
from campaign_trigger.errors import QuotaExceeded
from campaign_trigger.services import quota
from campaign_trigger.services.auth import Identity, identity_from_header, require_sender
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import Storage, get_storage

QUOTA_STATE_KEY = "quota_remaining"

# Documents the scheme on the OpenAPI page; the header itself is read below, so that
# every failure gets our error body and status.
bearer_scheme = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>` from `POST /users/sign_in`."
)


def get_session() -> Iterator[Session]:
    """The call's session, committed when the handler succeeds."""
    with session_scope() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_storage_dep(settings: SettingsDep) -> Storage:
    return get_storage(settings)


StorageDep = Annotated[Storage, Depends(get_storage_dep)]


def current_identity(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Identity:
    """The caller named by the bearer token (401 otherwise)."""
    identity = identity_from_header(
        session=session,
        settings=settings,
        authorization=request.headers.get("authorization"),
    )
    request.state.identity = identity
    return identity


CurrentAccount = Annotated[Identity, Depends(current_identity)]


def quota_identity(request: Request, session: SessionDep, identity: CurrentAccount) -> Identity:
    """The caller, after taking one unit of its organisation's quota (429 when spent)."""
    try:
        state = quota.consume(session=session, org_id=identity.org_id)
        session.commit()  # counted whatever the call's outcome
    except QuotaExceeded:
        metrics.QUOTA_REFUSALS.inc()
        session.rollback()
        setattr(request.state, QUOTA_STATE_KEY, 0)
        raise
    setattr(request.state, QUOTA_STATE_KEY, state.remaining)
    return identity


QuotaAccount = Annotated[Identity, Depends(quota_identity)]


def sender_identity(identity: QuotaAccount) -> Identity:
    """The caller, if its role may create and cancel requests (403 otherwise)."""
    require_sender(identity)
    return identity


Sender = Annotated[Identity, Depends(sender_identity)]
