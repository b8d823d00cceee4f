"""Apps' own provider credentials: set, show (never the secret), and resolve for sending.

An Android app holds a Firebase service-account JSON (its project id comes from it); an
iOS app an APNs ``.p8`` key with its key id, team id, bundle id (the ``apns-topic``)
and environment. The secret part is stored sealed (``services/sealed.py``); the rest is
what ``admin show-app`` prints. Every change bumps the row's ``version``, and a worker
resolves an app's credentials at every chunk, so a rotation takes effect at the next
chunk without a restart (``delivery/providers.py`` replaces a pooled provider of an
older version).

An app without credentials of its own sends with the global ``CT_FCM_*`` / ``CT_APNS_*``
ones, or the sandbox's keys when none are configured — unless
``CT_REQUIRE_APP_CREDENTIALS`` (production) is on: then a push request for it is
refused at create (:func:`check_sendable`) and, should the credentials disappear
meanwhile, its messages fail at delivery (``FPErrPushFailed``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Final

from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.delivery.credentials import (
    ApnsCredentials,
    CredentialsError,
    FcmCredentials,
    apns_credentials,
    app_apns_credentials,
    app_fcm_credentials,
    check_apns_key,
    fcm_credentials,
    has_global_credentials,
    parse_service_account,
    public_key_sha256,
)
from campaign_trigger.errors import AdminError, InvalidInput
from campaign_trigger.services import audience
from campaign_trigger.services.sealed import SealError, seal, unseal
from campaign_trigger.store.models import (
    ApnsEnvironment,
    App,
    AppCredentials,
    Platform,
    PushService,
)

log = logging.getLogger(__name__)

ProviderCredentials = FcmCredentials | ApnsCredentials

_APPLE_ID: Final = re.compile(r"^[A-Za-z0-9]{1,64}$")  # Apple's are 10 characters
_BUNDLE_ID: Final = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


class MissingCredentials(InvalidInput):
    """Production mode: an app of the campaign has no provider credentials."""


def sealed_context(app_id: str, service: PushService) -> str:
    """Where an app's sealed secret belongs (a value copied to another row does not open)."""
    return f"app:{app_id}:{service.value}"


def _app(session: Session, app_id: str) -> App:
    app = session.exec(select(App).where(App.app_id == app_id)).first()
    if app is None:
        raise AdminError(f"Unknown app {app_id!r}")
    return app


def _store(session: Session, row: AppCredentials) -> AppCredentials:
    existing = session.get(AppCredentials, row.app_id)
    if existing is not None:
        row.version = existing.version + 1
        session.delete(existing)
        session.flush()
    app = _app(session, row.app_id)
    app.provider_auth_failed_at = None  # new credentials: the old refusal says nothing
    session.add(app)
    session.add(row)
    session.flush()
    return row


def set_fcm_credentials(
    *, session: Session, settings: Settings, app_id: str, service_account: bytes
) -> AppCredentials:
    """Give an Android app its Firebase service account (the JSON key file's bytes)."""
    app = _app(session, app_id)
    if app.platform != Platform.android:
        raise AdminError(f"App {app_id!r} is an iOS app: give it an APNs key (--apns-key)")
    try:
        fields = parse_service_account(service_account)
    except CredentialsError as exc:
        raise AdminError(f"Unusable service account for {app_id!r}: {exc}") from None
    return _store(
        session,
        AppCredentials(
            app_id=app_id,
            service=PushService.fcm,
            key_id=fields["private_key_id"],
            project_id=fields["project_id"],
            client_email=fields["client_email"],
            public_key_sha256=public_key_sha256(fields["private_key"]),
            sealed_secret=seal(
                settings, service_account, context=sealed_context(app_id, PushService.fcm)
            ),
        ),
    )


def set_apns_credentials(
    *,
    session: Session,
    settings: Settings,
    app_id: str,
    key: bytes,
    key_id: str,
    team_id: str,
    topic: str,
    development: bool = False,
) -> AppCredentials:
    """Give an iOS app its APNs signing key (the ``.p8`` file's bytes) and its ids."""
    app = _app(session, app_id)
    if app.platform != Platform.ios:
        raise AdminError(
            f"App {app_id!r} is an Android app: give it a service account (--fcm-service-account)"
        )
    for name, value in (("key id", key_id), ("team id", team_id)):
        if not _APPLE_ID.match(value):
            raise AdminError(f"Invalid {name} {value!r}: letters and digits (Apple's have 10)")
    if not _BUNDLE_ID.match(topic) or len(topic) > 200:
        raise AdminError(f"Invalid topic {topic!r}: a bundle id such as com.example.app")
    try:
        pem = check_apns_key(key)
    except CredentialsError as exc:
        raise AdminError(f"Unusable APNs key for {app_id!r}: {exc}") from None
    environment = ApnsEnvironment.development if development else ApnsEnvironment.production
    return _store(
        session,
        AppCredentials(
            app_id=app_id,
            service=PushService.apns,
            key_id=key_id,
            team_id=team_id,
            topic=topic,
            environment=environment,
            public_key_sha256=public_key_sha256(pem),
            sealed_secret=seal(settings, key, context=sealed_context(app_id, PushService.apns)),
        ),
    )


def remove_credentials(*, session: Session, app_id: str) -> bool:
    """Forget an app's own credentials; whether it had any."""
    _app(session, app_id)
    existing = session.get(AppCredentials, app_id)
    if existing is None:
        return False
    session.delete(existing)
    session.flush()
    return True


def describe_app(*, session: Session, settings: Settings, app_id: str) -> dict[str, str]:
    """What ``admin show-app`` prints: the app and its credentials, never a secret."""
    app = _app(session, app_id)
    shown = {
        "app_id": app.app_id,
        "platform": app.platform.value,
        "identity_verification": "on" if app.identity_verification else "off",
        "provider_auth_failed_at": (
            app.provider_auth_failed_at.isoformat() if app.provider_auth_failed_at else "-"
        ),
    }
    row = session.get(AppCredentials, app_id)
    if row is None:
        android = app.platform == Platform.android
        if has_global_credentials(settings, android=android):
            shown["credentials"] = "global (CT_FCM_*)" if android else "global (CT_APNS_*)"
        elif settings.require_app_credentials:
            shown["credentials"] = "none: push requests are refused (CT_REQUIRE_APP_CREDENTIALS)"
        else:
            shown["credentials"] = "none: pushes go to the sandbox"
        return shown
    shown["credentials"] = f"own ({row.service.value}), version {row.version}"
    if row.service == PushService.fcm:
        shown["project_id"] = row.project_id or ""
        shown["client_email"] = row.client_email or ""
        shown["private_key_id"] = row.key_id
    else:
        shown["key_id"] = row.key_id
        shown["team_id"] = row.team_id or ""
        shown["topic"] = row.topic or ""
        shown["environment"] = row.environment.value if row.environment else ""
    shown["public_key_sha256"] = row.public_key_sha256
    shown["updated_at"] = row.updated_at.isoformat()
    return shown


def _identity(row: AppCredentials) -> str:
    """What a pooled provider is opened with: new whenever the credentials are set. The
    version alone starts again at 1 after a removal: a worker kept sending with the
    removed key and topic (``providers.pooled_provider``). Each setting seals its secret
    with a new nonce, so its sealed value tells one setting from another."""
    digest = hashlib.sha256(row.sealed_secret.encode("ascii")).hexdigest()[:16]
    return f"app:{row.app_id}:v{row.version}:{digest}"


def _own(settings: Settings, row: AppCredentials) -> ProviderCredentials:
    secret = unseal(settings, row.sealed_secret, context=sealed_context(row.app_id, row.service))
    identity = _identity(row)
    if row.service == PushService.fcm:
        return app_fcm_credentials(
            settings, service_account=parse_service_account(secret), identity=identity
        )
    return app_apns_credentials(
        settings,
        private_key=secret.decode("ascii"),
        key_id=row.key_id,
        team_id=row.team_id or "",
        topic=row.topic or "",
        development=row.environment == ApnsEnvironment.development,
        identity=identity,
    )


def provider_credentials(
    *, session: Session, settings: Settings, app_id: str, platform: Platform
) -> ProviderCredentials | None:
    """The credentials an app's pushes are sent with now; None if it may not send.

    None: production mode and no credentials, or its own do not open (logged, without
    the secret).
    """
    row = session.exec(
        select(AppCredentials)
        .where(AppCredentials.app_id == app_id)
        .execution_options(populate_existing=True)  # another process may have rotated them
    ).first()
    if row is not None:
        try:
            return _own(settings, row)
        except (SealError, CredentialsError, UnicodeDecodeError) as exc:
            log.error("credentials of app %s are unusable: %s", app_id, exc)
            return None
    android = platform == Platform.android
    if settings.require_app_credentials and not has_global_credentials(settings, android=android):
        return None
    return fcm_credentials(settings) if android else apns_credentials(settings)


def check_sendable(*, session: Session, settings: Settings, campaign_id: str) -> None:
    """Production mode: refuse, naming the first app of the campaign without credentials.

    Outside production mode, no query (a create's campaign check is one read)."""
    if not settings.require_app_credentials:
        return
    app_ids = [
        app.app_id for app in audience.campaign_apps(session=session, campaign_id=campaign_id)
    ]
    rows = session.exec(select(App).where(col(App.app_id).in_(app_ids))).all()
    own = set(
        session.exec(
            select(AppCredentials.app_id).where(col(AppCredentials.app_id).in_(app_ids))
        ).all()
    )
    for app in sorted(rows, key=lambda a: a.app_id):
        android = app.platform == Platform.android
        if app.app_id not in own and not has_global_credentials(settings, android=android):
            raise MissingCredentials(
                f"App {app.app_id} has no push provider credentials: set them with "
                "campaign-trigger admin set-credentials"
            )
