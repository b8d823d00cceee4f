"""Alembic environment: runs migrations on the URL that ``store.migrate`` passes in."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from campaign_trigger.store import models  # noqa: F401  (registers the tables)
from campaign_trigger.store.db import engine_for

target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url
    connectable = engine_for(url)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
