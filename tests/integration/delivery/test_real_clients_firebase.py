"""Google's firebase-admin against the sandbox: ``send`` and ``send_each_async``, every
outcome mapped to its exception class.

firebase-admin reads its token URI from the service-account file, as from Google's
console; nothing is patched but the FCM base URL (``_MessagingService.FCM_URL``).
google-auth also starts a background "regional access boundary" lookup at
iamcredentials.googleapis.com; that name does not resolve here, and the lookup fails in
its own thread without affecting the sends (its warnings show in the captured log).
Both clients retry 500 and 503 (so ``flaky-`` ends in success); only ``send`` (urllib3)
also retries a 429 with Retry-After, so ``throttled-`` is a success there and a
``QuotaExceededError`` from ``send_each_async`` (httpx), as they would be with Google."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import firebase_admin
import httpx
import pytest
from firebase_admin import credentials, exceptions, messaging
from google.auth.exceptions import RefreshError

from campaign_trigger.config import get_settings
from campaign_trigger.delivery.credentials import fcm_credentials

pytestmark = pytest.mark.slow  # firebase-admin retries a 500 four times with backoff (~7 s)

EXPECTED: dict[str, type[Exception] | None] = {
    "ok-fb": None,
    "flaky-fb": None,  # 503, then the retry firebase-admin makes succeeds
    "unregistered-fb": messaging.UnregisteredError,
    "mismatch-fb": messaging.SenderIdMismatchError,
    "invalid-fb": exceptions.InvalidArgumentError,
    "expired-fb": exceptions.InvalidArgumentError,
    "throttled-fb": messaging.QuotaExceededError,
    "fail-fb": exceptions.InternalError,
}


def service_account(sandbox: str, tmp_path: Path, *, project: str = "p") -> Path:
    """The service's sandbox key as a Google service-account file pointing at the sandbox."""
    creds = fcm_credentials(get_settings())
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": creds.private_key_id,
        "private_key": creds.private_key,
        "client_email": creds.client_email,
        "client_id": "1",
        "token_uri": f"{sandbox}/token",
    }
    path = tmp_path / f"{project}.json"
    path.write_text(json.dumps(info))
    return path


@pytest.fixture
def app_for(sandbox: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setattr(
        messaging._MessagingService, "FCM_URL", f"{sandbox}/v1/projects/{{0}}/messages:send"
    )
    apps: list[firebase_admin.App] = []

    def make(project: str = "p", path: Path | None = None) -> firebase_admin.App:
        certificate = credentials.Certificate(
            str(path or service_account(sandbox, tmp_path, project=project))
        )
        app = firebase_admin.initialize_app(certificate, name=f"sandbox-{uuid.uuid4().hex}")
        apps.append(app)
        return app

    yield make
    for app in apps:
        # firebase-admin closes its httpx client with asyncio.run(); after send_each_async
        # that client's connections belong to the test's loop, already closed: it raises,
        # after it has forgotten the app.
        with contextlib.suppress(RuntimeError):
            firebase_admin.delete_app(app)


def outcome(send: object) -> type[Exception] | None:
    try:
        name = send()  # type: ignore[operator]
    except Exception as exc:  # the class is what is checked
        return type(exc)
    assert name.startswith("projects/p/messages/0:")
    return None


def test_send_raises_the_documented_exception_for_every_outcome(
    app_for: object, sandbox: str
) -> None:
    app = app_for()  # type: ignore[operator]
    note = messaging.Notification(title="Hi", body="There")

    def sender(token: str) -> object:
        return lambda: messaging.send(messaging.Message(token=token, notification=note), app=app)

    with ThreadPoolExecutor(len(EXPECTED)) as pool:
        got = dict(zip(EXPECTED, pool.map(outcome, [sender(t) for t in EXPECTED]), strict=True))
    assert got == {**EXPECTED, "throttled-fb": None}  # urllib3 honours Retry-After on a 429
    assert outcome(lambda: messaging.send(messaging.Message(fid="ok-fb-fid"), app=app)) is None
    dry = messaging.send(
        messaging.Message(token="ok-fb-dry", notification=note), dry_run=True, app=app
    )
    assert dry == "projects/p/messages/fake_message_id"
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token"] == {"ok-fb": 1, "flaky-fb": 1, "throttled-fb": 1, "ok-fb-fid": 1}
    assert stats["validated"] == 1


async def test_send_each_async_reports_every_outcome(app_for: object, sandbox: str) -> None:
    app = app_for()  # type: ignore[operator]
    android = messaging.AndroidConfig(
        collapse_key="req-1:dev-1", notification=messaging.AndroidNotification(tag="req-1:dev-1")
    )
    batch = [messaging.Message(token=token, android=android) for token in EXPECTED]
    response = await messaging.send_each_async(batch, dry_run=False, app=app)
    got = {
        token: None if r.success else type(r.exception)
        for token, r in zip(EXPECTED, response.responses, strict=True)
    }
    assert got == EXPECTED
    assert response.success_count == 2
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token_collapse"]["ok-fb"] == {"req-1:dev-1": 1}


def test_a_denied_project_and_an_unknown_key_are_refused(
    app_for: object, sandbox: str, tmp_path: Path
) -> None:
    denied = app_for("denied-p")  # type: ignore[operator]
    with pytest.raises(exceptions.PermissionDeniedError):
        messaging.send(messaging.Message(token="ok-fb"), app=denied)
    path = service_account(sandbox, tmp_path)
    info = json.loads(path.read_text())
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    info["private_key"] = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    path.write_text(json.dumps(info))
    stranger = app_for(path=path)  # type: ignore[operator]
    with pytest.raises(RefreshError, match="invalid_grant: Invalid JWT Signature"):
        messaging.send(messaging.Message(token="ok-fb"), app=stranger)
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0
