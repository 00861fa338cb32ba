"""Add ``calls.api``: the API of a call, ``chat`` (chat completions) or ``responses``.

Records without the field are chat completions; existing rows read ``chat``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column, ``chat`` for every existing row."""
    op.add_column("calls", sa.Column("api", sa.String(length=16), nullable=False, server_default="chat"))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("api")
