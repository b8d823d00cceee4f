"""complete payloads: a campaign's data, image, sound, badge, priority, TTL and APNs
options; in-app entries with data, image and an expiry

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 18:00:00.000000

Existing campaigns keep what they sent: no data, no image, the default sound, high
priority, the providers' default expiry, an alert (not silent). Existing inbox entries
have no data, no image and do not expire.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import campaign_trigger.store.models

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CAMPAIGN_COLUMNS = (
    "silent",
    "category",
    "thread_id",
    "interruption_level",
    "ttl_seconds",
    "priority",
    "badge",
    "sound",
    "image",
    "data",
)


def upgrade() -> None:
    # Plain ADD COLUMN (no batch copy): on SQLite, copying ``campaign`` would drop a table
    # that requests reference, which foreign keys refuse.
    op.add_column("campaign", sa.Column("data", sa.JSON(), nullable=False, server_default="{}"))
    op.add_column("campaign", sa.Column("image", sa.Text(), nullable=True))
    op.add_column(
        "campaign", sa.Column("sound", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True)
    )
    op.add_column("campaign", sa.Column("badge", sa.Integer(), nullable=True))
    op.add_column(
        "campaign",
        sa.Column(
            "priority",
            sa.Enum("high", "normal", name="pushpriority", native_enum=False, length=16),
            nullable=False,
            server_default="high",
        ),
    )
    op.add_column("campaign", sa.Column("ttl_seconds", sa.Integer(), nullable=True))
    op.add_column(
        "campaign",
        sa.Column("interruption_level", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    )
    op.add_column(
        "campaign",
        sa.Column("thread_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    )
    op.add_column(
        "campaign",
        sa.Column("category", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    )
    op.add_column(
        "campaign", sa.Column("silent", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("inboxmessage", sa.Column("data", sa.JSON(), nullable=False, server_default="{}"))
    op.add_column("inboxmessage", sa.Column("image", sa.Text(), nullable=True))
    op.add_column(
        "inboxmessage",
        sa.Column(
            "expires_at", campaign_trigger.store.models.UTCDateTime(timezone=True), nullable=True
        ),
    )


def downgrade() -> None:
    for column in ("expires_at", "image", "data"):
        op.drop_column("inboxmessage", column)
    for column in _CAMPAIGN_COLUMNS:
        op.drop_column("campaign", column)
