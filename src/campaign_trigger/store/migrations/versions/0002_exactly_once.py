"""exactly once: outcomes keyed by message row, fixed chunk size, run owner

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 14:10:00

* ``outcome.row_no`` replaces ``outcome.chunk_no``: one row per (request, app, message
  row, device) at most, so outcomes can be recorded as answers arrive and a re-run
  skips exactly what was recorded. Existing rows get their id as row number (unique,
  and in the order they were written).
* ``request.chunk_size``: fixed when the request is created (was ``work/<id>/plan.json``).
* ``request.run_owner``: the worker running the request's flow run, taken over by a
  single compare-and-set when that worker dies.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on ``request`` (no batch copy): on SQLite, copying the table would
    # drop it under the rows that reference it (foreign keys are on). The server default
    # fills the existing rows and stays (autogenerate does not compare defaults).
    op.add_column(
        "request", sa.Column("chunk_size", sa.Integer(), nullable=False, server_default="5000")
    )
    op.add_column(
        "request",
        sa.Column("run_owner", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    )

    # ``outcome`` is referenced by no table: a batch copy is safe.
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.add_column(sa.Column("row_no", sa.Integer(), nullable=True))
    op.execute("UPDATE outcome SET row_no = id")
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.alter_column("row_no", existing_type=sa.Integer(), nullable=False)
        batch_op.drop_index("ix_outcome_request_app")
        batch_op.drop_column("chunk_no")
        batch_op.create_unique_constraint(
            "uq_outcome_request_app_row_device", ["request_id", "app_id", "row_no", "device_id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.drop_constraint("uq_outcome_request_app_row_device", type_="unique")
        batch_op.add_column(sa.Column("chunk_no", sa.Integer(), nullable=False, server_default="0"))
        batch_op.create_index("ix_outcome_request_app", ["request_id", "app_id"], unique=False)
        batch_op.drop_column("row_no")
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.alter_column("chunk_no", server_default=None)
    op.drop_column("request", "run_owner")  # native DROP COLUMN (SQLite 3.35+): no copy
    op.drop_column("request", "chunk_size")
