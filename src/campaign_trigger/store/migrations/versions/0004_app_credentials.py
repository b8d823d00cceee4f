"""per-app provider credentials, sealed

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 17:40:00.000000

- ``appcredentials``: an app's own FCM service account or APNs key; the secret part is
  stored only sealed (AES-256-GCM under a key derived from the service secret).
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import campaign_trigger.store.models

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "appcredentials",
        sa.Column("app_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column(
            "service",
            sa.Enum("fcm", "apns", name="pushservice", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("key_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("project_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("client_email", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=True),
        sa.Column("team_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("topic", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column(
            "environment",
            sa.Enum(
                "production", "development", name="apnsenvironment", native_enum=False, length=16
            ),
            nullable=True,
        ),
        sa.Column("public_key_sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("sealed_secret", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "updated_at", campaign_trigger.store.models.UTCDateTime(timezone=True), nullable=False
        ),
        sa.ForeignKeyConstraint(["app_id"], ["app.app_id"]),
        sa.PrimaryKeyConstraint("app_id"),
    )


def downgrade() -> None:
    op.drop_table("appcredentials")
