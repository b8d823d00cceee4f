"""Suite-wide fixtures: an isolated home, database and Prefect server per test session.

The environment is fixed here, at import time, before any test imports Prefect or
reads settings: ``CT_HOME`` is a fresh folder and ``PREFECT_API_URL`` names a free
port on which the ``prefect_server`` fixture starts a real server when asked. What a
test leaves to be sent (a request in the outbox, an open delivery run) is cancelled at
its end, so that no later test of the session sends it.
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
# A delivery run whose worker died is taken over after 40 s without a heartbeat (the
# least the setting allows), not the default 90 s: heartbeats every 5 s, a lease of 20 s.
os.environ["CT_DEAD_RUN_AFTER_SECONDS"] = "40"
# Every test process and server shares one database and calls from 127.0.0.1: the
# per-address sign-in budget would let one test's failed sign-ins throttle another's.
# The throttle's own tests start servers with the real budgets and their own addresses.
os.environ["CT_SIGN_IN_ADDRESS_FAILURES"] = "1000000"


@pytest.fixture(scope="session")
def session_dir() -> Iterator[Path]:
    """A folder for this test session's files (logs, homes of child processes)."""
    yield SESSION_DIR
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def shared_prefect_ssl_contexts() -> None:
    """Prefect clients of the test process share their TLS context, as a worker's do: the
    tests open one a poll (``wait_for_state``, 4 a second), and building each context
    took 15 % of the scale-out test's process, which also runs the sandbox."""
    from campaign_trigger.deployments.prefect_ssl import share_prefect_ssl_contexts

    share_prefect_ssl_contexts()


@pytest.fixture(scope="session", autouse=True)
def session_database(session_dir: Path) -> str:
    """The session's migrated SQLite database; its URL."""
    from campaign_trigger.config import get_settings
    from campaign_trigger.store.migrate import upgrade

    get_settings.cache_clear()
    url = get_settings().database_url
    upgrade(url)
    return url


_prefect_server_up = False
"""Whether this process's ``prefect_server`` has answered: from then on any process of the
test may have created delivery runs on it."""


@pytest.fixture(autouse=True)
def nothing_left_to_send(session_database: str) -> Iterator[None]:
    """What a test left to be sent is cancelled at its end (``leftovers.py``): the requests
    it added to the session database's outbox and the delivery runs created during it
    still open (a request scheduled ahead, a run marked dead, a create whose API was
    killed). What module fixtures made before the test is kept."""
    from leftovers import Leftovers

    leftovers = Leftovers.before(session_database)
    yield
    leftovers.cancel(prefect=_prefect_server_up)


def _create_postgres_database(prefix: str) -> str | None:
    """A fresh database on the test PostgreSQL server; None when none answers."""
    import sqlalchemy as sa

    from campaign_trigger.store.db import normalise_url

    base = os.environ.get("CT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    admin = sa.create_engine(normalise_url(base), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError:
        return None
    finally:
        admin.dispose()
    url = sa.engine.make_url(normalise_url(base)).set(database=name)
    return url.render_as_string(hide_password=False)


def _drop_postgres_database(url: str) -> None:
    import sqlalchemy as sa

    base = os.environ.get("CT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    from campaign_trigger.store.db import normalise_url

    admin = sa.create_engine(normalise_url(base), isolation_level="AUTOCOMMIT")
    name = sa.engine.make_url(url).database
    with admin.connect() as connection:
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def prefect_server(session_dir: Path) -> Iterator[ManagedProcess]:
    """A real Prefect server on the port PREFECT_API_URL names.

    Backed by PostgreSQL when the test server answers (the set-up DESIGN.md §7 recommends
    under load: a SQLite-backed Prefect server answers concurrent writes with "database is
    locked"), else by SQLite. ``campaign-trigger up``'s own SQLite server is tested apart.
    """
    global _prefect_server_up
    database = _create_postgres_database("ct_prefect")
    env = {}
    if database is not None:
        async_url = database.replace("postgresql+psycopg://", "postgresql+asyncpg://", 1)
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = async_url
    server = ManagedProcess(
        "prefect-server", prefect_server_argv(PREFECT_PORT), env=env, log_dir=session_dir
    )
    try:
        wait_http(f"http://127.0.0.1:{PREFECT_PORT}/api/health", timeout=90, process=server)
        _prefect_server_up = True
        yield server
    finally:
        _prefect_server_up = False
        server.stop()
        if database is not None:
            _drop_postgres_database(database)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (dropped afterwards); skips loudly if none answers."""
    url = _create_postgres_database("ct_test")
    if url is None:
        base = os.environ.get("CT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
        pytest.skip(
            f"!!! NO POSTGRESQL at {base}: PostgreSQL tests SKIPPED; set CT_TEST_POSTGRES_URL !!!"
        )
    try:
        yield url
    finally:
        from campaign_trigger.store.db import engine_for

        engine_for(url).dispose()
        engine_for.cache_clear()
        _drop_postgres_database(url)
