"""Add ``threshold_history.details``: machine-readable extras of a decision (JSON).

What it holds: lower bounds in seconds for quantiles the data cannot identify
(``quantile_lower_bounds_s``), the fields a configuration change set (``changes``) and the
inputs behind a flag. NULL where a row has none.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable JSON column ``threshold_history.details``."""
    with op.batch_alter_table("threshold_history") as batch:
        batch.add_column(sa.Column("details", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop ``threshold_history.details``."""
    with op.batch_alter_table("threshold_history") as batch:
        batch.drop_column("details")
