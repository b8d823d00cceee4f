"""Apply the Alembic migrations shipped in ``store/migrations`` (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from campaign_trigger.store.db import engine_for, normalise_url

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# The newest migration's revision (a test checks it is Alembic's head). A database already
# there is left alone without loading Alembic: every admin command migrates first, and
# Alembic's import and reading of the scripts took ~0.8 s of a slow machine's 3.4 s.
HEAD = "0009_webhook_event_order"


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalise_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at ``database_url`` to ``revision``."""
    if revision == "head" and current_revision(database_url) == HEAD:
        return
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    """The revision the database is at (None: never migrated), read without Alembic."""
    try:
        with engine_for(database_url).connect() as connection:
            return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError:  # no such table yet
        return None
