"""``admin reseal-secrets`` after a change of CT_SECRET_KEY: every sealed secret (app
credentials, webhook signing secrets) opens with the new secret afterwards; a wrong old
secret changes nothing; a second run changes nothing. On a database of its own: the
session's is sealed with the suite's secret."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_cli import ok, refused
from sqlmodel import select

from campaign_trigger.config import get_settings
from campaign_trigger.services import app_credentials, webhooks
from campaign_trigger.services.sealed import SealError, unseal
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import AppCredentials, Organisation, WebhookEndpoint
from credentials_support import service_account

OLD_SECRET = "old-" + "o" * 40
NEW_SECRET = "new-" + "n" * 40


@pytest.fixture
def own_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CT_DATABASE_URL", f"sqlite:///{tmp_path / 'rotation.sqlite'}")
    monkeypatch.setenv("CT_SECRET_KEY", OLD_SECRET)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def sealed_values() -> dict[str, tuple[str, str]]:
    """Each sealed value's place -> (its context, the sealed text)."""
    with session_scope() as session:
        found = {
            row.app_id: (app_credentials.sealed_context(row.app_id, row.service), row.sealed_secret)
            for row in session.exec(select(AppCredentials)).all()
        }
        for endpoint in session.exec(select(WebhookEndpoint)).all():
            found[endpoint.id] = (webhooks.secret_context(endpoint.id), endpoint.sealed_secret)
    return found


def opened() -> dict[str, bytes]:
    """Every sealed value opened with the current secret."""
    settings = get_settings()
    return {
        place: unseal(settings, value, context=context)
        for place, (context, value) in sealed_values().items()
    }


def test_a_changed_secret_is_followed_by_resealing_every_secret(
    own_database: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org, app_id = f"org-{uuid.uuid4().hex[:8]}", f"and-{uuid.uuid4().hex[:8]}"
    ok("create-org", org)
    ok("create-app", "--org", org, "--app-id", app_id, "--platform", "android")
    account_file = tmp_path / "sa.json"
    account_file.write_bytes(service_account("shop-prod").file_bytes())
    ok("set-credentials", "--app-id", app_id, "--fcm-service-account", str(account_file))
    with session_scope() as session:
        org_id = session.exec(select(Organisation.id).where(Organisation.name == org)).one()
        assert org_id is not None
        webhooks.register(
            session=session, settings=get_settings(), org_id=org_id, url="https://hooks.a.io/ct"
        )
    before = opened()
    assert len(before) == 2

    monkeypatch.setenv("CT_SECRET_KEY", NEW_SECRET)
    get_settings.cache_clear()
    with pytest.raises(SealError):
        opened()
    sealed = sealed_values()
    wrong, right = tmp_path / "wrong.key", tmp_path / "old.key"
    wrong.write_text("w" * 44 + "\n")
    right.write_text(OLD_SECRET + "\n")

    line = refused("reseal-secrets", "--old-secret-file", str(wrong))
    assert "Nothing changed: " in line
    assert "opens with neither the old nor the current secret" in line
    assert sealed_values() == sealed

    said = ok("reseal-secrets", "--old-secret-file", str(right))
    assert "1 app credentials, 1 webhook secrets (0 already were)" in said
    assert opened() == before
    assert "0 app credentials, 0 webhook secrets (2 already were)" in ok(
        "reseal-secrets", "--old-secret-file", str(right)
    )
    assert opened() == before
