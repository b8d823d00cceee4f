"""Dependencies of the routes, as ``Annotated`` aliases: handlers read like sentences.

``SessionDep`` is the API's one way to the database: one session per call, committed
when the handler returns and before the answer leaves (``scope="function"``), rolled
back when it raises. ``CurrentAccount`` authenticates; ``QuotaAccount`` authenticates
and takes one unit of the organisation's request quota (committed at once, so refused
calls count too); ``Sender`` further requires a role that may create and cancel requests.

Each dependency does its database work in one hop to a worker thread and ends its
transaction there: the session's pooled connection is held only while a thread works
on it, never while the call waits for a thread, for its body or for Prefect. (Held
across those waits, 15 connections went to calls queued for one of the 40 threads
while the threads waited for a connection: under load, creates stalled for the pool's
30 s time-out with the API idle.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

from anyio import CapacityLimiter, to_thread
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from campaign_trigger import metrics
from campaign_trigger.config import Settings, get_settings
from campaign_trigger.errors import QuotaExceeded
from campaign_trigger.services import quota
from campaign_trigger.services.auth import Identity, identity_from_header, require_sender
from campaign_trigger.store.db import get_engine
from campaign_trigger.store.files import Storage, get_storage

QUOTA_STATE_KEY = "quota_remaining"

# Documents the scheme on the OpenAPI page; the header itself is read below, so that
# every failure gets our error body and status.
bearer_scheme = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>` from `POST /users/sign_in`."
)


async def get_session() -> AsyncIterator[Session]:
    """The call's session, committed when the handler succeeds, rolled back when it raises.

    Made on the event loop (no I/O until the first query). A transaction still open at
    the end is ended in a thread of its own (not one of the pool's, which may all be
    waiting); one already ended costs no thread hop."""
    session = Session(get_engine(), expire_on_commit=False)
    try:
        yield session
    except BaseException:
        await _end(session, session.rollback)
        raise
    await _end(session, session.commit)


async def _end(session: Session, end: Callable[[], None]) -> None:
    try:
        if session.in_transaction():
            await to_thread.run_sync(end, limiter=CapacityLimiter(1))
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_storage_dep(settings: SettingsDep) -> Storage:
    return get_storage(settings)


StorageDep = Annotated[Storage, Depends(get_storage_dep)]


BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]


def _identify(request: Request, session: Session, settings: Settings) -> Identity:
    identity = identity_from_header(
        session=session,
        settings=settings,
        authorization=request.headers.get("authorization"),
    )
    request.state.identity = identity
    return identity


def _identified(request: Request, session: Session, settings: Settings) -> Identity:
    identity = _identify(request, session, settings)
    session.commit()  # the connection goes back to the pool before the next await
    return identity


async def current_identity(
    request: Request, session: SessionDep, settings: SettingsDep, _credentials: BearerCredentials
) -> Identity:
    """The caller named by the bearer token (401 otherwise)."""
    return await to_thread.run_sync(_identified, request, session, settings)


CurrentAccount = Annotated[Identity, Depends(current_identity)]


def _identified_with_quota(request: Request, session: Session, settings: Settings) -> Identity:
    identity = _identify(request, session, settings)
    try:
        state = quota.consume(session=session, org_id=identity.org_id, known=identity.allowance)
        session.commit()  # counted whatever the call's outcome
    except QuotaExceeded:
        metrics.QUOTA_REFUSALS.inc()
        session.rollback()
        setattr(request.state, QUOTA_STATE_KEY, 0)
        raise
    setattr(request.state, QUOTA_STATE_KEY, state.remaining)
    return identity


async def quota_identity(
    request: Request, session: SessionDep, settings: SettingsDep, _credentials: BearerCredentials
) -> Identity:
    """The caller (401 otherwise), after taking one unit of its organisation's quota (429
    when spent), in one thread hop."""
    return await to_thread.run_sync(_identified_with_quota, request, session, settings)


QuotaAccount = Annotated[Identity, Depends(quota_identity)]


async def sender_identity(identity: QuotaAccount) -> Identity:
    """The caller, if its role may create and cancel requests (403 otherwise)."""
    require_sender(identity)
    return identity


Sender = Annotated[Identity, Depends(sender_identity)]
