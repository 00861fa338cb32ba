"""Add ``calls.failover_denied``: a failover the client's failover retry budget refused.

Older records do not carry the field; existing rows and records without it read false.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 21:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column, false for every existing row."""
    op.add_column("calls", sa.Column("failover_denied", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("failover_denied")
