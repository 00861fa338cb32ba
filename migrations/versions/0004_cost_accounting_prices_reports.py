"""Cost accounting and the weekly report: attempts' prompt tokens, rollup token sums, prices, deliveries.

- ``attempts``: ``prompt_tokens`` (nullable: rows stored before this revision have none),
  ``prompt_tokens_estimated`` (false) and ``cached_prompt_tokens`` (nullable);
- ``hourly_rollups``: ``fold_version`` (1 for the rows already there, so the next fold
  recomputes the unsealed ones), prompt and completion tokens per role and of the extra
  (losing) attempts, cached and estimated prompt tokens (0), TPOT and e2e histograms and tokens
  per upstream (NULL: not known for rows folded before);
- ``prices``: USD per million tokens per model (optionally per upstream) from a whole UTC hour;
  rows are only added (the audit trail), indexed by (model, upstream, effective_from);
- ``report_deliveries``: one row per (kind, period) claimed by the process that sends it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 20:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLLUP_TOKENS = (
    "primary_prompt_tokens", "primary_completion_tokens", "backup_prompt_tokens", "backup_completion_tokens",
    "extra_prompt_tokens", "extra_completion_tokens", "cached_prompt_tokens", "estimated_prompt_tokens",
)  # fmt: skip
_ROLLUP_JSON = ("tpot_hist", "e2e_hist", "upstream_tokens")


def _id() -> sa.types.TypeEngine[int]:
    """64-bit ids, INTEGER on SQLite (its rowid primary keys)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Add the columns to ``attempts`` and ``hourly_rollups``; create ``prices`` and ``report_deliveries``."""
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("prompt_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("prompt_tokens_estimated", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("cached_prompt_tokens", sa.Integer(), nullable=True))
    with op.batch_alter_table("hourly_rollups") as batch:
        batch.add_column(sa.Column("fold_version", sa.Integer(), nullable=False, server_default="1"))
        for name in _ROLLUP_TOKENS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        for name in _ROLLUP_JSON:
            batch.add_column(sa.Column(name, sa.JSON(), nullable=True))
    op.create_table(
        "prices",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("upstream", sa.String(length=200), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_usd_per_mtok", sa.Float(), nullable=False),
        sa.Column("output_usd_per_mtok", sa.Float(), nullable=False),
        sa.Column("cached_input_usd_per_mtok", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=400), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
    )
    op.create_index(op.f("ix_prices_model_upstream_effective_from"), "prices", ["model", "upstream", "effective_from"])
    op.create_table(
        "report_deliveries",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("period", sa.String(length=32), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(length=1000), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_deliveries")),
        sa.UniqueConstraint("kind", "period", name=op.f("uq_report_deliveries_kind_period")),
    )


def downgrade() -> None:
    """Drop ``report_deliveries``, ``prices`` and the added columns (their values are lost)."""
    op.drop_table("report_deliveries")
    op.drop_index(op.f("ix_prices_model_upstream_effective_from"), table_name="prices")
    op.drop_table("prices")
    with op.batch_alter_table("hourly_rollups") as batch:
        for name in (*_ROLLUP_JSON, *reversed(_ROLLUP_TOKENS), "fold_version"):
            batch.drop_column(name)
    with op.batch_alter_table("attempts") as batch:
        for name in ("cached_prompt_tokens", "prompt_tokens_estimated", "prompt_tokens"):
            batch.drop_column(name)
