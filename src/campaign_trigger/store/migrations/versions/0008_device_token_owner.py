"""device token owner: a push token belongs to one device of an app

Revision ID: 0008_device_token_owner
Revises: 0007_device_fillfactor
Create Date: 2026-12-03 14:40:00.000000

An app deleted and reinstalled registers a new device id with the same APNs token; the
old row, never told of an uninstall, still named its last user, so a message for that
user reached whoever used the phone now (or the same user twice). The writers now take
a token from every other device of the app (``services/devices.py``,
``services/device_import.py``); this migration does the same for the rows already
there: of the devices of an app holding one token, the most recently updated keeps it
(the highest id on a tie), the others lose it and count as uninstalled.

``ix_device_push_token`` finds the holders of a token: a hash index on PostgreSQL (a
token may be 4096 characters, past a B-tree entry's 2704 bytes), a plain one on SQLite.
A new token of a device is then no longer a HOT update (an indexed column changed).

The downgrade drops the index; the tokens taken stay taken.
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import campaign_trigger.store.models

revision: str = "0008_device_token_owner"
down_revision: str | None = "0007_device_fillfactor"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HELD = "push_token IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_device_push_token",
        "device",
        ["push_token"],
        unique=False,
        postgresql_using="hash",
        postgresql_where=sa.text(HELD),
        sqlite_where=sa.text(HELD),
    )
    now = sa.bindparam("now", datetime.now(UTC), type_=campaign_trigger.store.models.UTCDateTime())
    op.get_bind().execute(
        sa.text(
            "UPDATE device SET push_token = NULL, updated_at = :now,"
            " uninstalled_at = COALESCE(uninstalled_at, :now)"
            " WHERE push_token IS NOT NULL AND EXISTS ("
            "  SELECT 1 FROM device AS newer"
            "  WHERE newer.push_token = device.push_token AND newer.app_id = device.app_id"
            "  AND (newer.updated_at > device.updated_at"
            "   OR (newer.updated_at = device.updated_at AND newer.id > device.id)))"
        ).bindparams(now)
    )


def downgrade() -> None:
    op.drop_index(
        "ix_device_push_token",
        table_name="device",
        postgresql_using="hash",
        postgresql_where=sa.text(HELD),
        sqlite_where=sa.text(HELD),
    )
