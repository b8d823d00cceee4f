"""A real SQLite database per test, handed to services as sessions (no Prefect, no server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, SQLModel

from campaign_trigger.config import Settings, get_settings
from campaign_trigger.services import prefect_runs
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.files import Storage, get_storage
from service_support import Org, make_org


@pytest.fixture(autouse=True)
def _no_cached_deployment_id() -> Iterator[None]:
    """These tests' fake Prefect servers give deployment ids that the cache would keep
    under the session server's URL (a 404 for the next file's runs in this process)."""
    prefect_runs.forget_deployment_id()
    yield
    prefect_runs.forget_deployment_id()


@pytest.fixture
def database(tmp_path: Path) -> str:
    """A fresh SQLite database with every table; its URL."""
    url = f"sqlite:///{tmp_path / 'unit.sqlite'}"
    SQLModel.metadata.create_all(engine_for(url))
    return url


@pytest.fixture
def session(database: str) -> Iterator[Session]:
    with Session(engine_for(database), expire_on_commit=False) as session:
        yield session


# Set for the whole session by the e2e suite's sandbox (for a test by the flow suite's): not
# these tests' business.
SANDBOX_ENV = ("CT_SANDBOX_PORT", "CT_SANDBOX_TLS_PORT", "CT_SEND_TO_SANDBOX")


@pytest.fixture
def settings(tmp_path: Path, database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The defaults (whatever suites ran before), with this test's database and storage."""
    for name in SANDBOX_ENV:
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield get_settings().model_copy(
        update={
            "database_url": database,
            "storage_url": str(tmp_path / "storage"),
            "chunk_size": 3,
        }
    )
    get_settings.cache_clear()  # the next caller reads the environment restored


@pytest.fixture
def storage(settings: Settings) -> Storage:
    return get_storage(settings)


@pytest.fixture
def org(session: Session) -> Org:
    return make_org(session)
