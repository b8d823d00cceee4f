"""Every time stored in PostgreSQL reads back, whatever the server's time zone."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from campaign_trigger.store.db import engine_for

LATEST = datetime(9999, 12, 31, 23, 30, tzinfo=UTC)  # a send time the API accepts


def test_the_latest_send_time_reads_back_from_a_server_east_of_utc(postgres_url: str) -> None:
    # PostgreSQL answers a timestamptz in the session's time zone, the server's default
    # unless the connection names one: in Tokyo, 9999-12-31 23:30 UTC is year 10000,
    # which psycopg refuses (DataError: timestamp too large): the request's cancel and its
    # campaign's scheduled list answered 500, and the outbox drainer failed on every pass.
    database = make_url(postgres_url).database
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(
                sa.text(f"ALTER DATABASE \"{database}\" SET timezone TO 'Asia/Tokyo'")
            )
    finally:
        admin.dispose()
    with engine_for(postgres_url).begin() as connection:
        connection.execute(sa.text("CREATE TABLE send_times (at timestamptz NOT NULL)"))
        connection.execute(sa.text("INSERT INTO send_times VALUES (:at)"), {"at": LATEST})
        assert connection.execute(sa.text("SELECT at FROM send_times")).scalar_one() == LATEST
