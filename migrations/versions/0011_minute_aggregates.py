"""Add ``minute_aggregates`` (per route and UTC minute: the tick's counters and TTFT histograms), backfilled.

From this revision on, ingest counts every call it stores into its (route, minute) row in the
same transaction (:mod:`hedgerow.controller.store.minute_store`). The upgrade creates the table and
fills it from the calls already stored, in batches of :data:`_BATCH_CALLS` calls by id: per
batch, the calls and their primary and backup attempts are read, counted by the application's
rules (:mod:`hedgerow.controller.policy.minute_counts`, the rules the tick reads with, so the
backfilled rows and those ingest writes are the same sums), and added to the rows stored. The
rows are emptied first, so running the backfill again (:func:`backfill`) gives the same rows.
Rows older than the tick's widest window are deleted by the next retention run. Run
``hedgerow db upgrade`` with the ``serve`` processes stopped (calls a 0010 server stores during
the backfill would not be counted).

Downgrade drops the table.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 16:30:00
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql, sqlite

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Calls read per backfill batch.
_BATCH_CALLS = 20_000
#: Keys per read of the stored rows.
_KEYS_PER_READ = 400

_TABLE = sa.table(
    "minute_aggregates",
    *(sa.column(name) for name in ("route_id", "minute_index", "calls", "hedged", "backup_wins", "denied", "wanted")),
    sa.column("histograms", sa.LargeBinary()),
)


def upgrade() -> None:
    """Create the table and its index, then backfill it from the stored calls."""
    op.create_table(
        "minute_aggregates",
        sa.Column("route_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("minute_index", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("hedged", sa.Integer(), nullable=False),
        sa.Column("backup_wins", sa.Integer(), nullable=False),
        sa.Column("denied", sa.Integer(), nullable=False),
        sa.Column("wanted", sa.Integer(), nullable=False),
        sa.Column("histograms", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["route_id"], ["routes.id"], name=op.f("fk_minute_aggregates_route_id_routes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("route_id", "minute_index", name=op.f("pk_minute_aggregates")),
    )
    op.create_index(op.f("ix_minute_aggregates_minute_index"), "minute_aggregates", ["minute_index"])
    backfill(op.get_bind())


def _stored(connection: sa.Connection, keys: list[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    stored: dict[tuple[int, int], Any] = {}
    for start in range(0, len(keys), _KEYS_PER_READ):
        chunk = keys[start : start + _KEYS_PER_READ]
        rows = connection.execute(
            sa.select(*_TABLE.c).where(sa.tuple_(_TABLE.c.route_id, _TABLE.c.minute_index).in_(chunk))
        ).all()
        stored.update({(row[0], row[1]): row for row in rows})
    return stored


def backfill(connection: sa.Connection) -> int:
    """Empty ``minute_aggregates`` and count every stored call into it; returns the calls counted.

    Args:
        connection: a connection in the migration's transaction.
    """
    from hedgerow.controller.policy.minute_counts import call_samples, count_minutes, first_samples
    from hedgerow.controller.store.minute_store import COLUMNS, merged_rows

    connection.execute(sa.text("DELETE FROM minute_aggregates"))
    insert: Any = postgresql.insert(_TABLE) if connection.dialect.name == "postgresql" else sqlite.insert(_TABLE)
    upsert = insert.on_conflict_do_update(
        index_elements=["route_id", "minute_index"], set_={name: insert.excluded[name] for name in COLUMNS[2:]}
    )
    last_id = -1
    total = 0
    while True:
        calls = connection.execute(
            sa.text(
                "SELECT id, route_id, started_at, hedge_reason, hedge_denied, winner, ttft_s FROM calls "
                "WHERE id > :last ORDER BY id LIMIT :n"
            ),
            {"last": last_id, "n": _BATCH_CALLS},
        ).all()
        if not calls:
            return total
        first, last_id = calls[0][0], calls[-1][0]
        attempts: dict[int, list[Any]] = {}
        for call_id, role, start_s, first_token_s, end_s, outcome in connection.execute(
            sa.text(
                "SELECT call_id, role, start_s, first_token_s, end_s, outcome FROM attempts "
                "WHERE call_id BETWEEN :first AND :last AND role IN ('primary', 'backup') "
                "ORDER BY call_id, attempt_index"
            ),
            {"first": first, "last": last_id},
        ):
            attempts.setdefault(call_id, []).append((role, start_s, first_token_s, end_s, outcome))
        samples = []
        for call_id, _route_id, _started_at, hedge_reason, hedge_denied, winner, ttft_s in calls:
            primary, backup = first_samples(attempts.get(call_id, ()))
            samples.append(call_samples(hedge_reason, hedge_denied, winner, ttft_s, primary, backup))
        counts = count_minutes([c[1] for c in calls], [_aware(c[2]) for c in calls], samples)
        rows = merged_rows(counts, _stored(connection, sorted(counts)))
        connection.execute(upsert, [dict(zip(COLUMNS, row, strict=True)) for row in rows])
        total += len(calls)


def _aware(value: Any) -> Any:
    """A ``started_at`` as read by a plain text query: aware UTC (SQLite gives naive UTC text)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def downgrade() -> None:
    """Drop the table."""
    op.drop_index(op.f("ix_minute_aggregates_minute_index"), table_name="minute_aggregates")
    op.drop_table("minute_aggregates")
