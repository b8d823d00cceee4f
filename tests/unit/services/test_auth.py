"""Tokens: signed, expiring, revocable; passwords checked with Argon2."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt
import pytest

from campaign_trigger.config import get_settings
from campaign_trigger.errors import Forbidden, Unauthenticated
from campaign_trigger.services.auth import (
    BAD_CREDENTIALS,
    BAD_TOKEN,
    EXPIRED_TOKEN,
    authenticate,
    hash_password,
    identity_from_header,
    issue_token,
    require_sender,
    revoke_token,
    verify_password,
)
from campaign_trigger.services.quota import Allowance
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Account, Organisation, RevokedToken, Role


@pytest.fixture
def account() -> Account:
    with session_scope() as session:
        org = Organisation(name=f"auth-{datetime.now(UTC).timestamp()}")
        session.add(org)
        session.flush()
        assert org.id is not None
        row = Account(
            org_id=org.id,
            email=f"a{org.id}@example.com",
            password_hash=hash_password("s3cret-pass"),
            role=Role.viewer,
        )
        session.add(row)
        session.flush()
        return row


def test_passwords_verify_only_themselves() -> None:
    hashed = hash_password("s3cret-pass")
    assert hashed.startswith("$argon2id$")
    assert verify_password(hashed, "s3cret-pass")
    assert not verify_password(hashed, "s3cret-pasS")
    assert not verify_password("not a hash", "s3cret-pass")


def test_authenticate_normalises_the_email(account: Account) -> None:
    with session_scope() as session:
        found = authenticate(
            session=session, email=f"  {account.email.upper()} ", password="s3cret-pass"
        )
        assert found.id == account.id
        for email, password in [(account.email, "wrong"), ("x@example.com", "s3cret-pass")]:
            with pytest.raises(Unauthenticated) as caught:
                authenticate(session=session, email=email, password=password)
            assert caught.value.message == BAD_CREDENTIALS


def test_token_round_trip_expiry_and_revocation(account: Account) -> None:
    settings = get_settings()
    token = issue_token(settings=settings, account=account)
    claims = jwt.decode(token, settings.token_key(), algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == settings.token_ttl_seconds
    with session_scope() as session:
        identity = identity_from_header(
            session=session, settings=settings, authorization=f"Bearer {token}"
        )
        assert (identity.account_id, identity.role) == (account.id, Role.viewer)
        with pytest.raises(Forbidden):
            require_sender(identity)
        revoke_token(session=session, identity=identity)
    with session_scope() as session:
        assert session.get(RevokedToken, identity.jti) is not None
        with pytest.raises(Unauthenticated) as caught:
            identity_from_header(
                session=session, settings=settings, authorization=f"bearer {token}"
            )
        assert caught.value.message == BAD_TOKEN
    old = issue_token(settings=settings, account=account, now=datetime.now(UTC) - timedelta(days=2))
    with session_scope() as session, pytest.raises(Unauthenticated) as caught:
        identity_from_header(session=session, settings=settings, authorization=f"Bearer {old}")
    assert caught.value.message == EXPIRED_TOKEN


def test_revocation_forgets_tokens_that_expired_anyway(account: Account) -> None:
    settings = get_settings()
    with session_scope() as session:
        session.add(RevokedToken(jti="long-gone", expires_at=datetime.now(UTC) - timedelta(1)))
    with session_scope() as session:
        identity = identity_from_header(
            session=session,
            settings=settings,
            authorization=f"Bearer {issue_token(settings=settings, account=account)}",
        )
        revoke_token(session=session, identity=identity)
    with session_scope() as session:
        assert session.get(RevokedToken, "long-gone") is None


def test_each_call_reads_the_account_its_revocation_and_its_quota_afresh(
    account: Account,
) -> None:
    settings = get_settings()
    header = f"Bearer {issue_token(settings=settings, account=account)}"
    with session_scope() as session:
        identity = identity_from_header(session=session, settings=settings, authorization=header)
        assert identity.allowance == Allowance(limit=10_000, period_kind="monthly")
        org = session.get(Organisation, account.org_id)
        assert org is not None
        org.request_quota, org.quota_period = 5, "daily"
        member = session.get(Account, account.id)
        assert member is not None
        member.role = Role.admin
    with session_scope() as session:  # the next call sees the changes: nothing is cached
        identity = identity_from_header(session=session, settings=settings, authorization=header)
        assert identity.allowance == Allowance(limit=5, period_kind="daily")
        assert identity.role == Role.admin
        revoke_token(session=session, identity=identity)
    with session_scope() as session, pytest.raises(Unauthenticated):
        identity_from_header(session=session, settings=settings, authorization=header)
    with session_scope() as session:
        session.delete(session.get(RevokedToken, identity.jti))
        session.delete(session.get(Account, account.id))
    with session_scope() as session, pytest.raises(Unauthenticated):
        identity_from_header(session=session, settings=settings, authorization=header)
