"""The migrations build the same schema as the models, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

from campaign_trigger.store import models  # noqa: F401
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import downgrade, upgrade


def _tables(url: str) -> set[str]:
    return set(sa.inspect(engine_for(url)).get_table_names()) - {"alembic_version"}


def _round_trip(url: str) -> None:
    upgrade(url)
    assert _tables(url) == set(SQLModel.metadata.tables)
    downgrade(url, "base")
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == set(SQLModel.metadata.tables)


def test_migrations_round_trip_on_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_migrations_round_trip_on_postgres(postgres_url: str) -> None:
    _round_trip(postgres_url)


def test_models_match_the_latest_migration(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    with engine_for(url).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert diff == [], f"models changed without a migration: {diff}"
