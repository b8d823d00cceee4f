"""completion webhooks: endpoints, their outbox of events, the attempts

Revision ID: 0006_webhooks
Revises: 0005
Create Date: 2026-11-22 20:40:00.000000

- ``webhookendpoint``: an organisation's URLs; the signing secret only sealed.
- ``webhookdelivery``: one completion event for one endpoint (the outbox the sender
  drains), with its next attempt's time.
- ``webhookattempt``: every POST made: when, the status or the error, how long.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import campaign_trigger.store.models

revision: str = "0006_webhooks"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc(name: str, *, nullable: bool) -> sa.Column[object]:
    return sa.Column(
        name, campaign_trigger.store.models.UTCDateTime(timezone=True), nullable=nullable
    )


def upgrade() -> None:
    op.create_table(
        "webhookendpoint",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("org_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("sealed_secret", sa.Text(), nullable=False),
        _utc("created_at", nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organisation.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_webhookendpoint_org_id"), "webhookendpoint", ["org_id"], unique=False)
    op.create_table(
        "webhookdelivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("endpoint_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("event_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("event_type", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("request_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        _utc("created_at", nullable=False),
        _utc("next_attempt_at", nullable=True),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        _utc("delivered_at", nullable=True),
        sa.ForeignKeyConstraint(["endpoint_id"], ["webhookendpoint.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("endpoint_id", "event_id"),
    )
    op.create_index("ix_webhookdelivery_due", "webhookdelivery", ["next_attempt_at"], unique=False)
    op.create_table(
        "webhookattempt",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        _utc("attempted_at", nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(length=300), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhookdelivery.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhookattempt_delivery", "webhookattempt", ["delivery_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_webhookattempt_delivery", table_name="webhookattempt")
    op.drop_table("webhookattempt")
    op.drop_index("ix_webhookdelivery_due", table_name="webhookdelivery")
    op.drop_table("webhookdelivery")
    op.drop_index(op.f("ix_webhookendpoint_org_id"), table_name="webhookendpoint")
    op.drop_table("webhookendpoint")
