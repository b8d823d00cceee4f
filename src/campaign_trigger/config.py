"""Settings: environment variables with the prefix ``CT_`` (and a ``.env`` file).

Use :func:`get_settings` everywhere; it is cached, and tests clear the cache
(``get_settings.cache_clear()``) after changing the environment.
"""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SANDBOX_URL = "http://127.0.0.1:8010"


class Settings(BaseSettings):
    """Every knob of the service. Defaults give the embedded, one-machine stack."""

    model_config = SettingsConfigDict(
        env_prefix="CT_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    home: Path = Field(default=Path(".data"), description="Folder for every local file.")
    database_url: str = Field(default="", description="SQLAlchemy URL; SQLite in home if empty.")
    storage_url: str = Field(default="", description="fsspec URL for uploads and reports.")
    secret_key: SecretStr = Field(
        default=SecretStr(""), description="Signs tokens and links; generated once if empty."
    )
    public_base_url: str = Field(default="", description="Base of links we hand out.")
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_reconciler: bool = Field(
        default=True, description="Run the outbox reconciler inside the API process."
    )
    sandbox_host: str = "127.0.0.1"
    sandbox_port: int = 8010
    prefect_port: int = 4200

    token_ttl_seconds: int = Field(default=24 * 3600, gt=0)
    link_ttl_seconds: int = Field(default=3600, gt=0)
    json_messages_cap: int = Field(default=1000, gt=0)
    max_upload_bytes: int = Field(default=1024**3, gt=0)
    quota_period: Literal["monthly", "daily"] = "monthly"
    default_quota: int = Field(default=10_000, ge=0)

    chunk_size: int = Field(default=5000, gt=0, description="Recipients per delivery chunk.")
    delivery_concurrency: int = Field(default=256, gt=0)
    delivery_max_attempts: int = Field(default=4, gt=0)
    max_lateness_seconds: int = Field(default=24 * 3600, gt=0)
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


def _stored_secret(home: Path) -> str:
    path = home / "secret.key"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        candidate = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        candidate.write_text(secrets.token_urlsafe(48))
        candidate.chmod(0o600)
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
