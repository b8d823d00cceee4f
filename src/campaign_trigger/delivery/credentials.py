"""Provider credentials and endpoints: an app's own, the global settings, the sandbox's.

An app's own credentials (``admin set-credentials``, stored sealed by
``services/app_credentials.py``) become :class:`FcmCredentials` / :class:`ApnsCredentials`
through :func:`app_fcm_credentials` and :func:`app_apns_credentials`: they go to Google
and Apple (APNs: the production or development host the app's environment names) unless
``CT_FCM_BASE_URL`` / ``CT_APNS_BASE_URL`` name another host, or ``CT_SEND_TO_SANDBOX``
sends everything to the sandbox (staging, tests). The global settings below are the
default for apps without credentials of their own (single-tenant installs).

With ``CT_FCM_CREDENTIALS_FILE`` (a Google service-account JSON) or ``CT_APNS_KEY_FILE``
(an Apple ``.p8`` key) set and the base URL left at the sandbox default, the real
provider hosts are used. Without credentials the sandbox is used, with the service's
sandbox keys, generated once in ``CT_HOME`` (``sandbox-fcm-key.pem``,
``sandbox-apns-key.p8``) and known to the sandbox, which checks every signature; the
sandbox's TLS CA (``CT_HOME/sandbox-ca.pem``) is then trusted for ``https://`` sandbox
URLs (``ca_file``). Keys are never logged (their ``repr`` hides them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from campaign_trigger.config import Settings
from campaign_trigger.delivery import sandbox_files
from campaign_trigger.delivery.sandbox_tls import ca_path

FCM_HOST: Final = "https://fcm.googleapis.com"
GOOGLE_TOKEN_URI: Final = "https://oauth2.googleapis.com/token"  # noqa: S105
APNS_HOST: Final = "https://api.push.apple.com"
APNS_DEVELOPMENT_HOST: Final = "https://api.sandbox.push.apple.com"
GLOBAL: Final = "global"  # the identity of credentials from settings


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
    identity: str = GLOBAL  # whose credentials, and which version of them


@dataclass(frozen=True, slots=True)
class ApnsCredentials:
    """What APNs needs: a signing key, its ids, the topic and where to send."""

    private_key: str = field(repr=False)
    key_id: str
    team_id: str
    topic: str
    base_url: str
    ca_file: str | None = None  # an extra CA to trust (the sandbox's)
    identity: str = GLOBAL  # whose credentials, and which version of them


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


def parse_service_account(raw: bytes) -> dict[str, str]:
    """The fields we use of a Google service-account JSON key file, checked.

    Raises :class:`CredentialsError` naming what is wrong (never the key itself).
    """
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CredentialsError("the service-account file is not JSON") from None
    if not isinstance(info, dict):
        raise CredentialsError("the service-account file is not a JSON object")
    if info.get("type") != "service_account":
        raise CredentialsError(
            'the file is not a service-account key ("type" is not "service_account")'
        )
    fields = {}
    for name in ("project_id", "private_key_id", "private_key", "client_email"):
        value = info.get(name)
        if not isinstance(value, str) or not value.strip():
            raise CredentialsError(f"the service-account file has no {name}")
        fields[name] = value.strip() if name != "private_key" else value
    if "@" not in fields["client_email"]:
        raise CredentialsError("the service-account client_email is not an e-mail address")
    try:
        key = serialization.load_pem_private_key(fields["private_key"].encode(), password=None)
    except (ValueError, TypeError):
        raise CredentialsError("the service-account private_key is not a PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
        raise CredentialsError("the service-account private_key is not an RSA key of 2048+ bits")
    token_uri = info.get("token_uri")
    fields["token_uri"] = (
        token_uri if isinstance(token_uri, str) and token_uri else GOOGLE_TOKEN_URI
    )
    return fields


def check_apns_key(pem: bytes) -> str:
    """Check an Apple ``.p8`` signing key (EC P-256); its PEM text."""
    try:
        text = pem.decode("ascii")
        key = serialization.load_pem_private_key(pem, password=None)
    except (UnicodeDecodeError, ValueError, TypeError):
        raise CredentialsError("the APNs key is not a PEM private key (.p8)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise CredentialsError("the APNs key is not an EC P-256 key (ES256), as Apple's .p8 is")
    return text


def public_key_sha256(private_pem: str) -> str:
    """SHA-256 of a private key's public half (DER): shows which key, reveals nothing."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def _own_host(settings: Settings, configured: str, default_sandbox: str, real: str) -> str:
    """Where an app's own credentials send: the configured URL when it is not the
    sandbox default (a proxy) or when told to send to the sandbox; else the real host."""
    if settings.send_to_sandbox or configured != default_sandbox:
        return configured
    return real


def _sandbox_ca(settings: Settings) -> str | None:
    return str(ca_path(settings.home)) if settings.send_to_sandbox else None


def app_fcm_credentials(
    settings: Settings, *, service_account: dict[str, str], identity: str
) -> FcmCredentials:
    """FCM credentials of an app's own service account (see :func:`parse_service_account`)."""
    sandbox = _sandbox_url(settings)
    return FcmCredentials(
        client_email=service_account["client_email"],
        private_key=service_account["private_key"],
        private_key_id=service_account["private_key_id"],
        token_uri=_own_host(
            settings, settings.fcm_token_uri, f"{sandbox}/token", service_account["token_uri"]
        ),
        project_id=service_account["project_id"],
        base_url=_own_host(settings, settings.fcm_base_url, sandbox, FCM_HOST),
        ca_file=_sandbox_ca(settings),
        identity=identity,
    )


def app_apns_credentials(
    settings: Settings,
    *,
    private_key: str,
    key_id: str,
    team_id: str,
    topic: str,
    development: bool,
    identity: str,
) -> ApnsCredentials:
    """APNs credentials of an app's own key; its environment picks Apple's host."""
    real = APNS_DEVELOPMENT_HOST if development else APNS_HOST
    return ApnsCredentials(
        private_key=private_key,
        key_id=key_id,
        team_id=team_id,
        topic=topic,
        base_url=_own_host(settings, settings.apns_base_url, _sandbox_url(settings), real),
        ca_file=_sandbox_ca(settings),
        identity=identity,
    )


def has_global_credentials(settings: Settings, *, android: bool) -> bool:
    """Whether settings name real provider credentials (not the sandbox's keys)."""
    return bool(settings.fcm_credentials_file if android else settings.apns_key_file)
