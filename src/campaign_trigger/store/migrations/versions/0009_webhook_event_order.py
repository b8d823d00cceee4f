"""webhook event order: a request's events reach an endpoint in the order they were queued

Revision ID: 0009_webhook_event_order
Revises: 0008_device_token_owner
Create Date: 2026-12-03 16:00:00.000000

A failed request retried in the Prefect UI ends processed: ``request.processed`` is
queued after ``request.failed``. The sender claimed due events by time alone, so with
``request.failed`` in backoff ``request.processed`` went first and the stale failure
arrived last. The sender now leaves an event while an earlier one of its request for its
endpoint is still to be tried (``services/webhook_sender.claim_due``, a NOT EXISTS
subquery); ``ix_webhookdelivery_waiting`` answers it from the events still to be tried
only (without it SQLite read every event of the endpoint for each due one: 2 s a claim
with 200 k settled events, 7 ms with it; PostgreSQL hashed the waiting ones instead).

The downgrade drops the index.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_webhook_event_order"
down_revision: str | None = "0008_device_token_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WAITING = "next_attempt_at IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_webhookdelivery_waiting",
        "webhookdelivery",
        ["request_id", "endpoint_id"],
        unique=False,
        postgresql_where=sa.text(WAITING),
        sqlite_where=sa.text(WAITING),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_webhookdelivery_waiting",
        table_name="webhookdelivery",
        postgresql_where=sa.text(WAITING),
        sqlite_where=sa.text(WAITING),
    )
