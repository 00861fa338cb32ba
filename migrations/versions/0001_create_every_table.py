"""Create every table of the store: routes, calls, attempts, thresholds, threshold_history, leases.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 08:22:22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.types.TypeEngine[int]:
    """64-bit ids, INTEGER on SQLite (its rowid primary keys)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts() -> sa.DateTime:
    """A timezone-aware timestamp column type (UTC)."""
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the tables, their constraints and indexes."""
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("expires_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_table(
        "routes",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("route", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("budget", sa.Float(), nullable=False),
        sa.Column("default_hedge_after_s", sa.Float(), nullable=False),
        sa.Column("min_hedge_after_s", sa.Float(), nullable=False),
        sa.Column("max_hedge_after_s", sa.Float(), nullable=False),
        sa.Column("pinned_hedge_after_s", sa.Float(), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routes")),
        sa.UniqueConstraint("route", "model", name=op.f("uq_routes_route_model")),
    )
    op.create_table(
        "calls",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("route_id", _id(), nullable=False),
        sa.Column("started_at", _ts(), nullable=False),
        sa.Column("received_at", _ts(), nullable=False),
        sa.Column("client", sa.String(length=200), nullable=True),
        sa.Column("hedge_after_s", sa.Float(), nullable=True),
        sa.Column("threshold_version", sa.BigInteger(), nullable=True),
        sa.Column("hedged", sa.Boolean(), nullable=False),
        sa.Column("hedge_reason", sa.String(length=32), nullable=True),
        sa.Column("hedge_denied", sa.Boolean(), nullable=False),
        sa.Column("winner", sa.String(length=16), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_type", sa.String(length=200), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("ttfo_s", sa.Float(), nullable=True),
        sa.Column("tpot_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("max_itl_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("wasted_completion_tokens", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["route_id"], ["routes.id"], name=op.f("fk_calls_route_id_routes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calls")),
        sa.UniqueConstraint("request_id", name=op.f("uq_calls_request_id")),
    )
    op.create_index(op.f("ix_calls_route_id_started_at"), "calls", ["route_id", "started_at"])
    op.create_table(
        "attempts",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("call_id", _id(), nullable=False),
        sa.Column("attempt_index", sa.Integer(), nullable=False),
        sa.Column("upstream", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("first_token_s", sa.Float(), nullable=True),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error_type", sa.String(length=200), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["call_id"], ["calls.id"], name=op.f("fk_attempts_call_id_calls"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("call_id", "attempt_index", name=op.f("uq_attempts_call_id_attempt_index")),
    )
    op.create_table(
        "thresholds",
        sa.Column("route_id", _id(), nullable=False),
        sa.Column("hedge_after_s", sa.Float(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.ForeignKeyConstraint(
            ["route_id"], ["routes.id"], name=op.f("fk_thresholds_route_id_routes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("route_id", name=op.f("pk_thresholds")),
    )
    op.create_table(
        "threshold_history",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("route_id", _id(), nullable=False),
        sa.Column("computed_at", _ts(), nullable=False),
        sa.Column("previous_hedge_after_s", sa.Float(), nullable=True),
        sa.Column("hedge_after_s", sa.Float(), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(length=400), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("censored", sa.Integer(), nullable=False),
        sa.Column("p50_s", sa.Float(), nullable=True),
        sa.Column("p75_s", sa.Float(), nullable=True),
        sa.Column("p90_s", sa.Float(), nullable=True),
        sa.Column("p95_s", sa.Float(), nullable=True),
        sa.Column("p99_s", sa.Float(), nullable=True),
        sa.Column("observed_hedge_rate", sa.Float(), nullable=True),
        sa.Column("backup_win_rate", sa.Float(), nullable=True),
        sa.Column("budget", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["route_id"],
            ["routes.id"],
            name=op.f("fk_threshold_history_route_id_routes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_threshold_history")),
    )
    op.create_index(
        op.f("ix_threshold_history_route_id_computed_at"),
        "threshold_history",
        ["route_id", "computed_at"],
    )


def downgrade() -> None:
    """Drop every table (children first)."""
    op.drop_index(op.f("ix_threshold_history_route_id_computed_at"), table_name="threshold_history")
    op.drop_table("threshold_history")
    op.drop_table("thresholds")
    op.drop_table("attempts")
    op.drop_index(op.f("ix_calls_route_id_started_at"), table_name="calls")
    op.drop_table("calls")
    op.drop_table("routes")
    op.drop_table("leases")
