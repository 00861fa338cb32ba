"""Add ``threshold_history.repeats`` and ``threshold_history.last_at``: history grows with decisions.

A hold whose decision and reason equal the previous row's no longer adds a row: the controller
updates that row (``repeats + 1``, ``last_at`` = the tick's time). Existing rows get
``repeats = 1`` and ``last_at = computed_at``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 20:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add both columns, fill them for the rows already stored, then make them NOT NULL."""
    with op.batch_alter_table("threshold_history") as batch:
        batch.add_column(sa.Column("repeats", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("last_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE threshold_history SET last_at = computed_at")
    with op.batch_alter_table("threshold_history") as batch:
        batch.alter_column("last_at", existing_type=sa.DateTime(timezone=True), nullable=False)


def downgrade() -> None:
    """Drop both columns (merged holds stay one row each)."""
    with op.batch_alter_table("threshold_history") as batch:
        batch.drop_column("last_at")
        batch.drop_column("repeats")
