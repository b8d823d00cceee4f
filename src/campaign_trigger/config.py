"""Settings: environment variables with the prefix ``CT_`` (and a ``.env`` file).

Use :func:`get_settings` everywhere; it is cached, and tests clear the cache
(``get_settings.cache_clear()``) after changing the environment.
"""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from campaign_trigger.store.private import FILE_MODE, private_dir

SANDBOX_URL = "http://127.0.0.1:8010"
TOKEN_KEY_INFO = b"campaign-trigger/access-tokens/v1"
LINK_KEY_INFO = b"campaign-trigger/signed-links/v1"
CREDENTIALS_KEY_INFO = b"campaign-trigger/provider-credentials/v1"
MIN_SECRET_BYTES = 32
KEY_TOO_SHORT = (
    "CT_SECRET_KEY must be at least {minimum} bytes long (it has {length}); "
    "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(48))' "
    "(or leave it unset: one is generated and kept in CT_HOME/secret.key)"
)


class Settings(BaseSettings):
    """Every knob of the service. Defaults give the embedded, one-machine stack."""

    model_config = SettingsConfigDict(
        env_prefix="CT_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        hide_input_in_errors=True,  # a refused secret is never printed
    )

    home: Path = Field(default=Path(".data"), description="Folder for every local file.")
    database_url: str = Field(default="", description="SQLAlchemy URL; SQLite in home if empty.")
    storage_url: str = Field(default="", description="fsspec URL for uploads and reports.")
    secret_key: SecretStr = Field(
        default=SecretStr(""),
        description="At least 32 bytes; the keys that sign tokens and links are derived "
        "from it. Generated once (CT_HOME/secret.key) if empty.",
    )
    public_base_url: str = Field(default="", description="Base of links we hand out.")
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_workers: int = Field(
        default=1,
        ge=1,
        description="Processes of `campaign-trigger api`; `up` runs this many when set, "
        "else one per four cores (at least one).",
    )
    api_reconciler: bool = Field(
        default=True, description="Run the outbox reconciler inside the API process."
    )
    sandbox_host: str = "127.0.0.1"
    sandbox_port: int = 8010
    sandbox_tls_port: int = Field(
        default=8443, description="The sandbox's TLS port (ALPN h2 and http/1.1, local CA)."
    )
    prefect_port: int = 4200
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines as text, or as JSON objects (one a line); a request id on each.",
    )
    worker_metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="The port of a delivery worker's GET /metrics (Prometheus); 0: none.",
    )

    token_ttl_seconds: int = Field(default=24 * 3600, gt=0)
    link_ttl_seconds: int = Field(default=3600, gt=0)
    json_messages_cap: int = Field(default=1000, gt=0)
    json_message_bytes: int = Field(
        default=2048,
        gt=0,
        description="Body bytes allowed per message of a JSON create: its body limit is "
        "json_messages_cap times this, plus 64 KB.",
    )
    max_upload_bytes: int = Field(default=1024**3, gt=0)
    quota_period: Literal["monthly", "daily"] = "monthly"
    sign_in_window_seconds: int = Field(
        default=15 * 60, gt=0, description="The sliding window of sign-in throttling."
    )
    sign_in_account_failures: int = Field(
        default=5, gt=0, description="Failed sign-ins per account within the window."
    )
    sign_in_address_failures: int = Field(
        default=50, gt=0, description="Failed sign-ins per client address within the window."
    )
    default_quota: int = Field(default=10_000, ge=0)

    chunk_size: int = Field(default=5000, gt=0, description="Recipients per delivery chunk.")
    chunks_per_run: int = Field(
        default=10,
        gt=0,
        description="A request of more chunks than this hands them to any worker in "
        "shares of this many: its run delivers shares from the first on, and offers "
        "others from the last back as deliver-chunks subflow runs, one more than were "
        "claimed since it last looked; smaller requests run in their own run.",
    )
    live_shares: int = Field(
        default=32,
        gt=0,
        le=200,
        description="The deliver-chunks runs a shared-out request keeps not yet ended; "
        "the next is offered as one ends. More than every worker's --chunk-concurrency "
        "together, so no worker waits for a share; bounded, so the Prefect server's work "
        "per second does not grow with the request (a gigabyte makes 513 shares).",
    )
    delivery_concurrency: int = Field(default=256, gt=0)
    delivery_max_attempts: int = Field(default=4, gt=0)
    max_lateness_seconds: int = Field(default=24 * 3600, gt=0)
    dead_run_after_seconds: int = Field(
        default=90,
        ge=40,
        description="A delivery run without a heartbeat this long lost its worker: another "
        "worker takes it over (a worker sends its runs' heartbeats every eighth of it). A "
        "worker process whose heartbeats Prefect has not answered for half of it stops "
        "sending and exits (code 75) once the answers to the messages in flight are "
        "recorded; one frozen for half of what is left of it after a heartbeat exits as "
        "it resumes, before it sends again.",
    )
    report_retention_days: int = Field(default=30, gt=0)

    fcm_base_url: str = ""
    fcm_token_uri: str = ""
    fcm_project_id: str = "sandbox-project"
    fcm_credentials_file: str = ""
    apns_base_url: str = ""
    apns_key_file: str = ""
    apns_key_id: str = ""
    apns_team_id: str = ""
    apns_topic: str = "com.example.app"
    require_app_credentials: bool = Field(
        default=False,
        description="Production mode: a push request for a campaign with an app that has "
        "no provider credentials (its own, or the global CT_FCM_*/CT_APNS_* ones) is refused "
        "with a 400 naming the app, instead of being sent to the sandbox.",
    )
    send_to_sandbox: bool = Field(
        default=False,
        description="Send every app's pushes, with its own credentials, to the configured "
        "base URLs even when they are the sandbox's (staging, tests); otherwise an app's own "
        "credentials go to Google and Apple unless CT_FCM_BASE_URL / CT_APNS_BASE_URL name "
        "another host. Sandbox mode also lets completion webhooks be registered with http:// "
        "URLs (https:// only otherwise).",
    )

    webhook_retry_first_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Completion webhooks: the wait before the first retry of a refused or "
        "failed POST; each next wait doubles, up to webhook_retry_max_interval_seconds.",
    )
    webhook_retry_max_interval_seconds: float = Field(
        default=3600.0, gt=0, description="Completion webhooks: the longest wait between tries."
    )
    webhook_retry_window_seconds: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="Completion webhooks: an event not accepted this long after it happened "
        "is given up.",
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Completion webhooks: the time one POST may take."
    )
    webhook_poll_seconds: float = Field(
        default=1.0, gt=0, description="Completion webhooks: how often workers look for due events."
    )
    webhook_concurrency: int = Field(
        default=16, gt=0, description="Completion webhooks: POSTs in flight per worker process."
    )
    webhook_allow_private_addresses: bool = Field(
        default=False,
        description="Completion webhooks: allow URLs whose host is (or resolves to) a "
        "private, loopback, link-local or reserved address; refused otherwise, so that an "
        "organisation cannot make the service call its own network. Implied by "
        "send_to_sandbox.",
    )

    @field_validator("secret_key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        length = len(value.get_secret_value().encode("utf-8", "surrogatepass"))
        if 0 < length < MIN_SECRET_BYTES:
            raise ValueError(KEY_TOO_SHORT.format(minimum=MIN_SECRET_BYTES, length=length))
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.home / 'campaign-trigger.db').resolve()}"
        if not self.storage_url:
            self.storage_url = str((self.home / "storage").resolve())
        if not self.public_base_url:
            self.public_base_url = f"http://{self.api_host}:{self.api_port}"
        sandbox = f"http://{self.sandbox_host}:{self.sandbox_port}"
        if not self.fcm_base_url:
            self.fcm_base_url = sandbox
        if not self.fcm_token_uri:
            self.fcm_token_uri = f"{sandbox}/token"
        if not self.apns_base_url:
            self.apns_base_url = sandbox
        return self

    def secret(self) -> str:
        """The signing secret: the configured one, else one generated once and kept in home."""
        configured = self.secret_key.get_secret_value()
        if configured:
            return configured
        return _stored_secret(self.home.resolve())

    def token_key(self) -> bytes:
        """The HS256 key of access tokens (HKDF-SHA256 of the secret, its own label)."""
        return _derived_key(self.secret(), TOKEN_KEY_INFO)

    def link_key(self) -> bytes:
        """The HMAC key of signed links (HKDF-SHA256 of the secret, another label)."""
        return _derived_key(self.secret(), LINK_KEY_INFO)

    def credentials_key(self) -> bytes:
        """The AES-256-GCM key sealing apps' provider credentials (HKDF, its own label)."""
        return _derived_key(self.secret(), CREDENTIALS_KEY_INFO)


@lru_cache(maxsize=16)
def _derived_key(secret: str, info: bytes) -> bytes:
    """A 32-byte key for one purpose: a key of one purpose tells nothing of another's."""
    material = secret.encode("utf-8", "surrogatepass")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(material)


def _stored_secret(home: Path) -> str:
    path = home / "secret.key"
    if not path.exists():
        private_dir(home)
        candidate = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        # 0600 from its creation: the key is never readable by others, not even briefly
        descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
        try:
            path.hardlink_to(candidate)  # atomic: the first process to get here wins
        except FileExistsError:
            pass
        finally:
            candidate.unlink(missing_ok=True)
    return path.read_text().strip()


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
