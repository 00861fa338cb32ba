"""Add ``routes.archived_at`` and ``routes.archived_by``: a route an operator retired, history kept.

An archived route (``archived_at`` set) is left out of the route lists, the threshold table and
the controller's ticks, does not count against ``max_routes``, and its records are refused;
its calls and threshold history stay (:mod:`hedgerow.controller.routes_admin`). Existing routes
read NULL: none is archived.

Both columns are added with plain ``ALTER TABLE ... ADD COLUMN`` (nullable, no default), not in
batch mode: on SQLite a batch would copy ``routes`` into a new table, dropping its change-counter
triggers (migration 0008) and, with foreign keys on, deleting through ``ON DELETE CASCADE`` the
rows that refer to it. A column already there is left as it is, so the upgrade may be run again
on a store where it was half applied by hand. The downgrade drops them the same way (``ALTER
TABLE ... DROP COLUMN``, SQLite 3.35 or later); the archive marks are lost, the routes stay.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("archived_at", sa.DateTime(timezone=True)),
    ("archived_by", sa.String(length=200)),
)


def _existing() -> set[str]:
    """The names of the columns ``routes`` has now."""
    return {column["name"] for column in sa.inspect(op.get_bind()).get_columns("routes")}


def upgrade() -> None:
    """Add the nullable columns that are not there yet."""
    existing = _existing()
    for name, column_type in _COLUMNS:
        if name not in existing:
            op.add_column("routes", sa.Column(name, column_type, nullable=True))


def downgrade() -> None:
    """Drop the columns that are there (in place; see the module docstring)."""
    existing = _existing()
    for name, _type in reversed(_COLUMNS):
        if name in existing:
            op.execute(sa.text(f"ALTER TABLE routes DROP COLUMN {name}"))
