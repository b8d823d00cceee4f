"""Accounts and tokens: password checks, JWT access tokens (HS256), sign-out revocation.

Tokens are signed with the token key (:meth:`Settings.token_key`, derived from the
secret by HKDF), never with the key of signed links.

A token names its account (``sub``), organisation and a unique ``jti``; it expires after
``settings.token_ttl_seconds``. Signing out stores the ``jti`` in ``RevokedToken`` until
the token would have expired anyway. The account is read again on every call, so a
deleted account, a changed role or a revoked token takes effect at once: one statement
reads the account, whether the token is revoked and the organisation's quota
(:class:`quota.Allowance`, which the API then takes a unit of).

An account id is not enough to name the account a token was issued to: SQLite gives a
new account the id of the newest one deleted. A token is refused unless its ``org`` is
the account's organisation and it was issued no earlier than the account was created.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from sqlalchemy import Select, bindparam, exists
from sqlmodel import Session, col, delete, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import Forbidden, SignInThrottled, Unauthenticated
from campaign_trigger.services import throttle
from campaign_trigger.services.passwords import hash_password, verify_password
from campaign_trigger.services.quota import Allowance
from campaign_trigger.store.models import Account, Organisation, RevokedToken, Role

__all__ = [
    "SENDER_ROLES",
    "Identity",
    "authenticate",
    "hash_password",
    "identity_from_token",
    "issue_token",
    "require_sender",
    "revoke_token",
    "sign_in",
    "verify_password",
]

ALGORITHM = "HS256"
BAD_CREDENTIALS = "Invalid email or password"
BAD_TOKEN = "Invalid or missing access token"  # noqa: S105 (a message)
EXPIRED_TOKEN = "The access token has expired, please sign in again"  # noqa: S105
SENDER_ROLES = frozenset({Role.owner, Role.admin, Role.member})

# Checked when the e-mail is unknown, so that both failures take the same time.
_DUMMY_HASH = hash_password("not-a-real-password")


@dataclass(frozen=True)
class Identity:
    """Who is calling: the account, its organisation and the token's id and expiry, and
    the organisation's quota as read with them (None if the organisation is gone)."""

    account_id: int
    org_id: int
    email: str
    role: Role
    jti: str
    expires_at: datetime
    allowance: Allowance | None


def authenticate(*, session: Session, email: str, password: str) -> Account:
    """The account with these credentials; Unauthenticated (same message) otherwise."""
    email = email.strip().lower()
    account = session.exec(select(Account).where(Account.email == email)).first()
    if account is None:
        verify_password(_DUMMY_HASH, password)
        raise Unauthenticated(BAD_CREDENTIALS)
    if not verify_password(account.password_hash, password):
        raise Unauthenticated(BAD_CREDENTIALS)
    return account


def sign_in(
    *, session: Session, settings: Settings, email: str, password: str, address: str
) -> Account:
    """:func:`authenticate`, throttled per account and per client address.

    SignInThrottled (429, with the seconds to wait) before any password hash when
    either budget is spent; a success resets the account's count. Each step commits on
    its own, so that other API processes see this attempt while its hash is computed.
    """
    reserved = throttle.reserve(session=session, settings=settings, email=email, address=address)
    session.commit()
    if isinstance(reserved, int):
        raise SignInThrottled(throttle.THROTTLED, retry_after_seconds=reserved)
    wait = throttle.confirm(session=session, settings=settings, reservation=reserved)
    session.commit()
    if wait is not None:
        raise SignInThrottled(throttle.THROTTLED, retry_after_seconds=wait)
    account = authenticate(session=session, email=email, password=password)
    session.commit()
    throttle.succeeded(session=session, reservation=reserved)
    session.commit()
    return account


def issue_token(*, settings: Settings, account: Account, now: datetime | None = None) -> str:
    """A signed access token for ``account``."""
    issued = now or datetime.now(UTC)
    claims: dict[str, Any] = {
        "sub": str(account.id),
        "org": account.org_id,
        "jti": uuid.uuid4().hex,
        "iat": int(issued.timestamp()),
        "exp": int((issued + timedelta(seconds=settings.token_ttl_seconds)).timestamp()),
    }
    return jwt.encode(claims, settings.token_key(), algorithm=ALGORITHM)


def _claims(*, settings: Settings, token: str) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            settings.token_key(),
            algorithms=[ALGORITHM],
            options={"require": ["sub", "jti", "exp", "iat"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise Unauthenticated(EXPIRED_TOKEN) from exc
    except jwt.InvalidTokenError as exc:
        raise Unauthenticated(BAD_TOKEN) from exc
    if not isinstance(claims["sub"], str) or not isinstance(claims["jti"], str):
        raise Unauthenticated(BAD_TOKEN)
    return claims


def _caller_statement() -> Select[Any]:
    """The account (``caller_account``), whether the token (``caller_jti``) is revoked,
    and its organisation's quota: one row, or none if the account is gone."""
    revoked = exists().where(col(RevokedToken.jti) == bindparam("caller_jti"))
    statement: Select[Any] = (
        select(  # type: ignore[call-overload]
            col(Account.id),
            col(Account.org_id),
            col(Account.email),
            col(Account.role),
            col(Account.created_at),
            revoked,
            col(Organisation.request_quota),
            col(Organisation.quota_period),
        )
        .outerjoin(Organisation, col(Organisation.id) == col(Account.org_id))
        .where(col(Account.id) == bindparam("caller_account"))
    )
    return statement


_CALLER = _caller_statement()


def identity_from_token(*, session: Session, settings: Settings, token: str) -> Identity:
    """The caller a token names; Unauthenticated when forged, expired, revoked or orphaned."""
    claims = _claims(settings=settings, token=token)
    try:
        account_id = int(claims["sub"])
    except ValueError as exc:
        raise Unauthenticated(BAD_TOKEN) from exc
    row = (
        session.connection()
        .execute(_CALLER, {"caller_jti": claims["jti"], "caller_account": account_id})
        .first()
    )
    if row is None:
        raise Unauthenticated(BAD_TOKEN)
    found_id, org_id, email, role, created_at, revoked, limit, period_kind = row
    if revoked or not _issued_to(claims, org_id=org_id, created_at=created_at):
        raise Unauthenticated(BAD_TOKEN)
    return Identity(
        account_id=found_id,
        org_id=org_id,
        email=email,
        role=Role(role),
        jti=claims["jti"],
        expires_at=datetime.fromtimestamp(int(claims["exp"]), UTC),
        allowance=None if limit is None else Allowance(limit=limit, period_kind=period_kind),
    )


def _issued_to(claims: dict[str, Any], *, org_id: int, created_at: datetime) -> bool:
    """Whether the token was issued to the account now holding its ``sub``: one of its
    organisation, created before the token (``iat`` has whole seconds)."""
    issued_at = claims["iat"]
    return (
        claims.get("org") == org_id
        and isinstance(issued_at, int)
        and issued_at >= int(created_at.timestamp())
    )


def identity_from_header(
    *, session: Session, settings: Settings, authorization: str | None
) -> Identity:
    """The caller named by an ``Authorization: Bearer <token>`` header value."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated(BAD_TOKEN)
    return identity_from_token(session=session, settings=settings, token=token.strip())


def revoke_token(*, session: Session, identity: Identity, now: datetime | None = None) -> None:
    """Sign out: the token is refused from now on. Forgets tokens that expired anyway."""
    moment = now or datetime.now(UTC)
    session.exec(delete(RevokedToken).where(col(RevokedToken.expires_at) < moment))
    if session.get(RevokedToken, identity.jti) is None:
        session.add(RevokedToken(jti=identity.jti, expires_at=identity.expires_at))


def organisation_name(*, session: Session, org_id: int) -> str:
    org = session.get(Organisation, org_id)
    return org.name if org is not None else ""


def require_sender(identity: Identity) -> None:
    """Forbidden unless the role may create or cancel requests."""
    if identity.role not in SENDER_ROLES:
        raise Forbidden(f"The role {identity.role.value} may not send or cancel requests")
