"""A database error names no value of its statement: its text reaches logs, tracebacks
and the Prefect UI's state messages (a rendered one-time code, a user id, a push token)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from campaign_trigger.store.db import engine_for

SECRET = "Your code is 100000"
USER = "user0@example.com"


def _duplicate_insert_error(url: str) -> IntegrityError:
    engine = engine_for(url)
    table = sa.Table(
        "secret_probe",
        sa.MetaData(),
        sa.Column("body", sa.Text, unique=True),
        sa.Column("user_id", sa.Text, nullable=False),
    )
    table.create(engine)
    with engine.begin() as connection:
        connection.execute(table.insert(), {"body": SECRET, "user_id": USER})
    with pytest.raises(IntegrityError) as raised, engine.begin() as connection:
        connection.execute(table.insert(), {"body": SECRET, "user_id": USER})
    return raised.value


def _told(exc: BaseException) -> str:
    """Everything a log line or a traceback of ``exc`` shows, its causes included."""
    return "".join(traceback.format_exception(exc))


def test_a_sqlite_error_names_no_parameter(tmp_path: Path) -> None:
    told = _told(_duplicate_insert_error(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "UNIQUE constraint failed" in told
    assert SECRET not in told
    assert USER not in told


@pytest.mark.postgres
def test_a_postgres_error_names_no_parameter_nor_the_row_of_its_detail(
    postgres_url: str,
) -> None:
    exc = _duplicate_insert_error(postgres_url)
    told = _told(exc)
    assert "duplicate key value violates unique constraint" in told
    assert SECRET not in told
    assert USER not in told
    assert "(psycopg.errors.UniqueViolation)" in str(exc)
