"""Add ``hourly_rollups``: calls of one (route, model) and UTC hour folded into counters and histograms.

Filled by :func:`hedgerow.controller.store.rollups.fold_hours`; lets weekly figures survive the
deletion of raw calls by :mod:`hedgerow.controller.store.retention`. Unique (route_id, hour_start).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 10:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = (
    "calls", "ok_calls", "error_calls", "timeout_calls", "stalled_calls", "cancelled_calls",
    "hedges", "hedge_denied", "backup_wins", "failovers",
)  # fmt: skip
_TOKENS = ("prompt_tokens", "completion_tokens", "wasted_completion_tokens")
_HISTOGRAMS = ("primary_ttft_hist", "primary_censored_hist", "call_ttft_hist")


def _id() -> sa.types.TypeEngine[int]:
    """64-bit ids, INTEGER on SQLite (its rowid primary keys)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create ``hourly_rollups`` with its unique (route_id, hour_start) and an index on hour_start."""
    op.create_table(
        "hourly_rollups",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("route_id", _id(), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("folded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_call_id", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in _COUNTERS),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _TOKENS),
        sa.Column("primary_samples", sa.Integer(), nullable=False),
        sa.Column("primary_censored", sa.Integer(), nullable=False),
        sa.Column("histogram_scheme", sa.String(length=64), nullable=False),
        *(sa.Column(name, sa.JSON(), nullable=False) for name in _HISTOGRAMS),
        sa.ForeignKeyConstraint(
            ["route_id"],
            ["routes.id"],
            name=op.f("fk_hourly_rollups_route_id_routes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hourly_rollups")),
        sa.UniqueConstraint("route_id", "hour_start", name=op.f("uq_hourly_rollups_route_id_hour_start")),
    )
    op.create_index(op.f("ix_hourly_rollups_hour_start"), "hourly_rollups", ["hour_start"])


def downgrade() -> None:
    """Drop ``hourly_rollups`` (the rollups are lost; raw calls already deleted stay deleted)."""
    op.drop_index(op.f("ix_hourly_rollups_hour_start"), table_name="hourly_rollups")
    op.drop_table("hourly_rollups")
