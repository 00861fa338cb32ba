"""Partition ``calls`` and ``attempts`` by UTC day on PostgreSQL; ``attempts.call_started_at`` everywhere.

Every database: ``attempts`` gets ``call_started_at``, its call's ``started_at`` (filled from
``calls`` for the existing rows).

PostgreSQL (see :mod:`hedgerow.controller.store.partitions` for the design): the plain tables are
renamed ``calls_old`` / ``attempts_old``; new ``calls`` (range of ``started_at``) and ``attempts``
(range of ``call_started_at``) are created partitioned, with one partition per day that has
rows plus today to three days ahead; every row is copied with its id (the id sequences move to
the new tables, so ids keep growing from where they were); ``call_request_ids`` gets the
``request_id`` of every call; the old tables are dropped. All in the migration's one transaction:
a failure leaves the store as it was. The copy holds the tables for as long as it takes (about a
minute per few million calls): run ``hedgerow db upgrade`` with the ``serve`` processes stopped.

The partition DDL is written out here, not imported, so this revision keeps doing what it did
when the application's code moves on.

Downgrade converts back to plain tables (rows kept; ``request_id`` unique again).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Days after today given partitions by the migration (the retention job keeps this up).
_DAYS_AHEAD = 3
#: Indexes of the plain tables (index names are unique per schema, so they move aside first).
_PLAIN_INDEXES = (
    "pk_calls",
    "uq_calls_request_id",
    "ix_calls_route_id_started_at",
    "pk_attempts",
    "uq_attempts_call_id_attempt_index",
)


def _partition_ddl(day: date) -> list[str]:
    """Create and attach the ``calls`` and ``attempts`` partitions of ``day`` (as of this revision)."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    bounds = f"FROM ('{start.isoformat()}') TO ('{(start + timedelta(days=1)).isoformat()}')"
    calls, attempts = f"calls_p{day:%Y%m%d}", f"attempts_p{day:%Y%m%d}"
    return [
        f"CREATE TABLE {calls} (LIKE calls INCLUDING DEFAULTS)",
        f"ALTER TABLE {calls} ADD CONSTRAINT pk_{calls} PRIMARY KEY (id)",
        f"ALTER TABLE calls ATTACH PARTITION {calls} FOR VALUES {bounds}",
        f"CREATE TABLE {attempts} (LIKE attempts INCLUDING DEFAULTS)",
        f"ALTER TABLE {attempts} ADD CONSTRAINT pk_{attempts} PRIMARY KEY (id), "
        f"ADD CONSTRAINT uq_{attempts}_call_id_attempt_index UNIQUE (call_id, attempt_index), "
        f"ADD CONSTRAINT fk_{attempts}_call_id_{calls} FOREIGN KEY (call_id) REFERENCES {calls} (id) "
        "ON DELETE CASCADE",
        f"ALTER TABLE attempts ATTACH PARTITION {attempts} FOR VALUES {bounds}",
    ]


def upgrade() -> None:
    """Add ``attempts.call_started_at``; on PostgreSQL, move both tables into day partitions."""
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("attempts") as batch:
            batch.add_column(sa.Column("call_started_at", sa.DateTime(timezone=True), nullable=True))
        op.execute(
            "UPDATE attempts SET call_started_at = (SELECT started_at FROM calls WHERE calls.id = attempts.call_id)"
        )
        with op.batch_alter_table("attempts") as batch:
            batch.alter_column("call_started_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        return
    bind = op.get_bind()
    op.execute("ALTER TABLE attempts RENAME TO attempts_old")
    op.execute("ALTER TABLE calls RENAME TO calls_old")
    for name in _PLAIN_INDEXES:
        op.execute(f"ALTER INDEX {name} RENAME TO {name}_old")
    op.execute("CREATE TABLE calls (LIKE calls_old INCLUDING DEFAULTS) PARTITION BY RANGE (started_at)")
    op.execute(
        "ALTER TABLE calls ADD CONSTRAINT fk_calls_route_id_routes FOREIGN KEY (route_id) "
        "REFERENCES routes (id) ON DELETE CASCADE"
    )
    op.execute("CREATE INDEX ix_calls_route_id_started_at ON calls (route_id, started_at)")
    op.execute(
        "CREATE TABLE attempts (LIKE attempts_old INCLUDING DEFAULTS, call_started_at TIMESTAMP WITH TIME ZONE "
        "NOT NULL) PARTITION BY RANGE (call_started_at)"
    )
    op.execute(
        "CREATE TABLE call_request_ids (request_id VARCHAR(200) NOT NULL, "
        "started_at TIMESTAMP WITH TIME ZONE NOT NULL, CONSTRAINT pk_call_request_ids PRIMARY KEY (request_id))"
    )
    op.execute("CREATE INDEX ix_call_request_ids_started_at ON call_request_ids USING brin (started_at)")
    stored = bind.execute(sa.text("SELECT DISTINCT (started_at AT TIME ZONE 'UTC')::date FROM calls_old")).scalars()
    today = datetime.now(UTC).date()
    days = set(stored) | {today + timedelta(days=n) for n in range(_DAYS_AHEAD + 1)}
    for day in sorted(days):
        for statement in _partition_ddl(day):
            op.execute(statement)
    op.execute("INSERT INTO calls SELECT * FROM calls_old")
    op.execute("INSERT INTO attempts SELECT a.*, c.started_at FROM attempts_old a JOIN calls_old c ON c.id = a.call_id")
    op.execute("INSERT INTO call_request_ids (request_id, started_at) SELECT request_id, started_at FROM calls_old")
    op.execute("ALTER SEQUENCE calls_id_seq OWNED BY calls.id")
    op.execute("ALTER SEQUENCE attempts_id_seq OWNED BY attempts.id")
    op.execute("DROP TABLE attempts_old")
    op.execute("DROP TABLE calls_old")
    op.execute("ANALYZE calls")
    op.execute("ANALYZE attempts")


def downgrade() -> None:
    """Back to plain ``calls`` / ``attempts`` (every row kept); drop ``call_started_at``."""
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("attempts") as batch:
            batch.drop_column("call_started_at")
        return
    op.execute("ALTER TABLE attempts RENAME TO attempts_part")
    op.execute("ALTER TABLE calls RENAME TO calls_part")
    op.execute("ALTER INDEX ix_calls_route_id_started_at RENAME TO ix_calls_route_id_started_at_part")
    op.execute("CREATE TABLE calls (LIKE calls_part INCLUDING DEFAULTS)")
    op.execute("CREATE TABLE attempts (LIKE attempts_part INCLUDING DEFAULTS)")
    op.execute("ALTER TABLE attempts DROP COLUMN call_started_at")
    op.execute("INSERT INTO calls SELECT * FROM calls_part")
    columns = ", ".join(
        name
        for name in op.get_bind()
        .execute(
            sa.text(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'attempts'::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum"
            )
        )
        .scalars()
    )
    op.execute(f"INSERT INTO attempts ({columns}) SELECT {columns} FROM attempts_part")
    op.execute("ALTER SEQUENCE calls_id_seq OWNED BY calls.id")
    op.execute("ALTER SEQUENCE attempts_id_seq OWNED BY attempts.id")
    op.execute("DROP TABLE attempts_part")
    op.execute("DROP TABLE calls_part")
    op.execute("DROP TABLE call_request_ids")
    op.execute("ALTER TABLE calls ADD CONSTRAINT pk_calls PRIMARY KEY (id)")
    op.execute("ALTER TABLE calls ADD CONSTRAINT uq_calls_request_id UNIQUE (request_id)")
    op.execute(
        "ALTER TABLE calls ADD CONSTRAINT fk_calls_route_id_routes FOREIGN KEY (route_id) "
        "REFERENCES routes (id) ON DELETE CASCADE"
    )
    op.execute("CREATE INDEX ix_calls_route_id_started_at ON calls (route_id, started_at)")
    op.execute("ALTER TABLE attempts ADD CONSTRAINT pk_attempts PRIMARY KEY (id)")
    op.execute("ALTER TABLE attempts ADD CONSTRAINT uq_attempts_call_id_attempt_index UNIQUE (call_id, attempt_index)")
    op.execute(
        "ALTER TABLE attempts ADD CONSTRAINT fk_attempts_call_id_calls FOREIGN KEY (call_id) "
        "REFERENCES calls (id) ON DELETE CASCADE"
    )
