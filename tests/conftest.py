"""Suite-wide fixtures: an isolated home, database and Prefect server per test session.

The environment is fixed here, at import time, before any test imports Prefect or
reads settings: ``CT_HOME`` is a fresh folder and ``PREFECT_API_URL`` names a free
port on which the ``prefect_server`` fixture starts a real server when asked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import (
    DEFAULT_POSTGRES_URL,
    ManagedProcess,
    free_port,
    prefect_server_argv,
    prefect_server_env,
    wait_http,
)

SESSION_DIR = Path(tempfile.mkdtemp(prefix="ct-tests-"))
PREFECT_PORT = free_port()
PREFECT_HOME = SESSION_DIR / "prefect"
PREFECT_HOME.mkdir()
os.environ.update(prefect_server_env(PREFECT_HOME, PREFECT_PORT))
os.environ["CT_HOME"] = str(SESSION_DIR / "ct")
os.environ["CT_SECRET_KEY"] = uuid.uuid4().hex
for name in [
    key
    for key in os.environ
    if key.startswith("CT_") and key not in ("CT_HOME", "CT_SECRET_KEY", "CT_TEST_POSTGRES_URL")
]:
    del os.environ[name]


@pytest.fixture(scope="session")
def session_dir() -> Iterator[Path]:
    """A folder for this test session's files (logs, homes of child processes)."""
    yield SESSION_DIR
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def database(session_dir: Path) -> str:
    """The session's migrated SQLite database; its URL."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.store.migrate import upgrade

    get_settings.cache_clear()
    url = get_settings().database_url
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def prefect_server(session_dir: Path) -> Iterator[ManagedProcess]:
    """A real Prefect server (SQLite) on the port PREFECT_API_URL names."""
    server = ManagedProcess(
        "prefect-server", prefect_server_argv(PREFECT_PORT), log_dir=session_dir
    )
    try:
        wait_http(f"http://127.0.0.1:{PREFECT_PORT}/api/health", timeout=90, process=server)
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (dropped afterwards); skips loudly if none answers."""
    import sqlalchemy as sa

    base = os.environ.get("CT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    from campaign_trigger.store.db import normalise_url

    admin = sa.create_engine(normalise_url(base), isolation_level="AUTOCOMMIT")
    name = f"ct_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.skip(
            f"!!! NO POSTGRESQL at {base} ({exc.__class__.__name__}): "
            "PostgreSQL tests SKIPPED; set CT_TEST_POSTGRES_URL !!!"
        )
    url = sa.engine.make_url(normalise_url(base)).set(database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        from campaign_trigger.store.db import engine_for

        for engine in [engine_for(url.render_as_string(hide_password=False))]:
            engine.dispose()
        engine_for.cache_clear()
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
