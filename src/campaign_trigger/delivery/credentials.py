"""Provider credentials and endpoints from settings; the service's own sandbox keys.

With ``CT_FCM_CREDENTIALS_FILE`` (a Google service-account JSON) or ``CT_APNS_KEY_FILE``
(an Apple ``.p8`` key) set and the base URL left at the sandbox default, the real
provider hosts are used. Without credentials the sandbox is used, with the service's
sandbox keys, generated once in ``CT_HOME`` (``sandbox-fcm-key.pem``,
``sandbox-apns-key.p8``) and known to the sandbox, which checks every signature; the
sandbox's TLS CA (``CT_HOME/sandbox-ca.pem``) is then trusted for ``https://`` sandbox
URLs (``ca_file``). Keys are never logged (their ``repr`` hides them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization

from campaign_trigger.config import Settings
from campaign_trigger.delivery import sandbox_files
from campaign_trigger.delivery.sandbox_tls import ca_path

FCM_HOST: Final = "https://fcm.googleapis.com"
GOOGLE_TOKEN_URI: Final = "https://oauth2.googleapis.com/token"  # noqa: S105
APNS_HOST: Final = "https://api.push.apple.com"


class CredentialsError(ValueError):
    """A credentials file is missing or malformed."""


@dataclass(frozen=True, slots=True)
class FcmCredentials:
    """What FCM needs: a service account and where to send."""

    client_email: str
    private_key: str = field(repr=False)
    private_key_id: str
    token_uri: str
    project_id: str
    base_url: str
    ca_file: str | None = None  # an extra CA to trust (the sandbox's)


@dataclass(frozen=True, slots=True)
class ApnsCredentials:
    """What APNs needs: a signing key, its ids, the topic and where to send."""

    private_key: str = field(repr=False)
    key_id: str
    team_id: str
    topic: str
    base_url: str
    ca_file: str | None = None  # an extra CA to trust (the sandbox's)


@lru_cache(maxsize=8)
def _sandbox_fcm_key(home: Path) -> tuple[str, str]:
    pem = sandbox_files.service_fcm_key(home)
    return pem, sandbox_files.google_key_id(pem)


@lru_cache(maxsize=8)
def _sandbox_apns_key(home: Path) -> str:
    return sandbox_files.service_apns_key(home)


def _sandbox_url(settings: Settings) -> str:
    return f"http://{settings.sandbox_host}:{settings.sandbox_port}"


def fcm_credentials(settings: Settings) -> FcmCredentials:
    """FCM credentials and endpoints from settings (sandbox ones if no file is configured)."""
    sandbox = _sandbox_url(settings)
    if not settings.fcm_credentials_file:
        private_key, key_id = _sandbox_fcm_key(settings.home.resolve())
        return FcmCredentials(
            client_email=sandbox_files.SANDBOX_CLIENT_EMAIL,
            private_key=private_key,
            private_key_id=key_id,
            token_uri=settings.fcm_token_uri,
            project_id=settings.fcm_project_id,
            base_url=settings.fcm_base_url,
            ca_file=str(ca_path(settings.home)),
        )
    path = Path(settings.fcm_credentials_file)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        client_email = str(info["client_email"])
        private_key = str(info["private_key"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CredentialsError(
            f"unusable FCM credentials file {path}: {type(exc).__name__}"
        ) from None
    token_uri = settings.fcm_token_uri
    if token_uri == f"{sandbox}/token":
        token_uri = str(info.get("token_uri") or GOOGLE_TOKEN_URI)
    base_url = FCM_HOST if settings.fcm_base_url == sandbox else settings.fcm_base_url
    project = settings.fcm_project_id
    if project == "sandbox-project" and info.get("project_id"):
        project = str(info["project_id"])
    return FcmCredentials(
        client_email=client_email,
        private_key=private_key,
        private_key_id=str(info.get("private_key_id", "")),
        token_uri=token_uri,
        project_id=project,
        base_url=base_url,
    )


def apns_credentials(settings: Settings) -> ApnsCredentials:
    """APNs credentials and endpoint from settings (sandbox ones if no key file is configured)."""
    sandbox = _sandbox_url(settings)
    if not settings.apns_key_file:
        return ApnsCredentials(
            private_key=_sandbox_apns_key(settings.home.resolve()),
            key_id=settings.apns_key_id or sandbox_files.SANDBOX_APNS_KEY_ID,
            team_id=settings.apns_team_id or sandbox_files.SANDBOX_APNS_TEAM_ID,
            topic=settings.apns_topic,
            base_url=settings.apns_base_url,
            ca_file=str(ca_path(settings.home)),
        )
    path = Path(settings.apns_key_file)
    try:
        private_key = path.read_text(encoding="utf-8")
        serialization.load_pem_private_key(private_key.encode(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CredentialsError(f"unusable APNs key file {path}: {type(exc).__name__}") from None
    if not settings.apns_key_id or not settings.apns_team_id:
        raise CredentialsError("CT_APNS_KEY_ID and CT_APNS_TEAM_ID are required with a key file")
    base_url = APNS_HOST if settings.apns_base_url == sandbox else settings.apns_base_url
    return ApnsCredentials(
        private_key=private_key,
        key_id=settings.apns_key_id,
        team_id=settings.apns_team_id,
        topic=settings.apns_topic,
        base_url=base_url,
    )
