"""hardened edges: device secrets, identity verification, sign-in throttling

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 14:30:00.000000

- ``device.secret_hash``: SHA-256 of the device secret (existing devices have none
  until their app registers them again with their push token);
- ``app.identity_key`` (a fresh random key for every existing app) and
  ``app.identity_verification`` (off);
- ``signinfailure``: failed sign-ins per account and per client address.
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import campaign_trigger.store.models

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signinfailure",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=False),
        sa.Column(
            "failed_at", campaign_trigger.store.models.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("signinfailure", schema=None) as batch_op:
        batch_op.create_index("ix_signinfailure_key_time", ["key", "failed_at"], unique=False)
        batch_op.create_index("ix_signinfailure_time", ["failed_at"], unique=False)

    # Plain ADD COLUMN (no batch copy of the table): on SQLite, copying ``app`` would drop
    # a table that devices and campaigns reference, which foreign keys refuse.
    op.add_column(
        "device",
        sa.Column("secret_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    )
    op.add_column(
        "app",
        sa.Column(
            "identity_key",
            sqlmodel.sql.sqltypes.AutoString(length=128),
            nullable=False,
            server_default="",  # replaced below, row by row; an empty key verifies nothing
        ),
    )
    op.add_column(
        "app",
        sa.Column("identity_verification", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    app = sa.table("app", sa.column("id", sa.Integer()), sa.column("identity_key", sa.String()))
    connection = op.get_bind()
    for (app_id,) in connection.execute(sa.select(app.c.id)).all():
        key = f"idk_{secrets.token_urlsafe(32)}"
        connection.execute(sa.update(app).where(app.c.id == app_id).values(identity_key=key))


def downgrade() -> None:
    op.drop_column("app", "identity_verification")
    op.drop_column("app", "identity_key")
    op.drop_column("device", "secret_hash")

    with op.batch_alter_table("signinfailure", schema=None) as batch_op:
        batch_op.drop_index("ix_signinfailure_time")
        batch_op.drop_index("ix_signinfailure_key_time")

    op.drop_table("signinfailure")
