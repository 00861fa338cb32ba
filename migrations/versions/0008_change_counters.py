"""Add ``change_counters`` and the triggers that raise ``threshold_table`` on every change it shows.

The threshold table that clients poll (``GET /v1/thresholds``) is rendered from ``thresholds``
joined with ``routes``; each ``serve`` process keeps the rendered body in memory and checks
this one counter (a primary-key read) at most once per second to learn whether any process
changed it. Triggers, not application code, raise it, so no path that writes those tables can
forget to: every insert, update and delete of ``thresholds`` and every update of ``routes``
(a new route has no threshold yet; a deleted one takes its threshold row with it, by cascade).

Row-level triggers on both databases. SQLite drops a table's triggers with the table, and
Alembic's batch mode on SQLite rebuilds a table by copy and drop: a later migration that
alters ``routes`` or ``thresholds`` in batch mode must create these triggers again (the test of
the threshold cache at head fails if they are missing).

Revision ID: 0008
Revises: 0006
Create Date: 2026-12-01 23:55:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (table, event) pairs whose rows change the threshold table.
WATCHED: tuple[tuple[str, str], ...] = (
    ("thresholds", "INSERT"),
    ("thresholds", "UPDATE"),
    ("thresholds", "DELETE"),
    ("routes", "UPDATE"),
)
_BUMP = "UPDATE change_counters SET version = version + 1 WHERE name = 'threshold_table'"


def _trigger_name(table: str, event: str) -> str:
    return f"trg_{table}_{event.lower()}_threshold_table"


def upgrade() -> None:
    """Create the table with its one row, then the triggers of the dialect."""
    op.create_table(
        "change_counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_change_counters")),
    )
    op.execute("INSERT INTO change_counters (name, version) VALUES ('threshold_table', 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION hedgerow_bump_threshold_table() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {_BUMP}; RETURN NULL; END $$"
        )
        for table, event in WATCHED:
            op.execute(
                f"CREATE TRIGGER {_trigger_name(table, event)} AFTER {event} ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION hedgerow_bump_threshold_table()"
            )
    else:
        for table, event in WATCHED:
            op.execute(
                f"CREATE TRIGGER {_trigger_name(table, event)} AFTER {event} ON {table} FOR EACH ROW BEGIN {_BUMP}; END"
            )


def downgrade() -> None:
    """Drop the triggers, the function (PostgreSQL) and the table."""
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, event in WATCHED:
        op.execute(f"DROP TRIGGER IF EXISTS {_trigger_name(table, event)}" + (f" ON {table}" if postgresql else ""))
    if postgresql:
        op.execute("DROP FUNCTION IF EXISTS hedgerow_bump_threshold_table()")
    op.drop_table("change_counters")
