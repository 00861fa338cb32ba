"""The SQL store: SQLAlchemy 2 typed ORM models of every table hedgerow keeps.

Tables (docs/DESIGN.md "controller"):

- ``routes``: one row per (route, model), with its budget and threshold bounds; created on the
  first ingest of a call for that pair, with defaults from :class:`hedgerow.settings.Settings`.
- ``calls``: one row per :class:`hedgerow.client.records.CallRecord` (unique ``request_id``).
- ``attempts``: one row per attempt of a call (``attempt_index`` keeps the record's order;
  ``call_started_at`` repeats its call's ``started_at``, the key both tables are partitioned on).
- ``call_request_ids`` (PostgreSQL only): the ``request_id`` of every stored call, the unique
  key that makes ingest idempotent where ``calls`` is partitioned (see
  :mod:`hedgerow.controller.store.partitions`).
- ``thresholds``: the value published for a route; ``version`` increases whenever it changes.
- ``threshold_history``: every controller decision, applied or held, and manual changes
  (``actor`` names who made a manual change; NULL for the controller job).
- ``leases``: which process runs the scheduled jobs (see :mod:`hedgerow.controller.lease`).
- ``hourly_rollups``: one row per (route, model) and UTC hour of calls, folded from the raw rows
  so weekly figures survive their deletion (see :mod:`hedgerow.controller.store.rollups`).
- ``minute_aggregates``: one row per (route, model) and UTC minute of calls, the counters and
  TTFT histograms the controller's tick reads, kept up to date by ingest in the batch's
  transaction (see :mod:`hedgerow.controller.policy.minute_counts`).
- ``prices``: USD per million tokens of a model (optionally of one upstream), in force from a
  whole UTC hour; rows are never overwritten, so they are also the audit trail of price changes
  (see :mod:`hedgerow.controller.store.prices`).
- ``report_deliveries``: one row per (report kind, week) claimed by the job that sends it, so a
  weekly report is delivered once however many processes run (see
  :mod:`hedgerow.controller.report.report_job`).
- ``change_counters``: one row per derived view that readers cache (``threshold_table``),
  whose ``version`` database triggers raise in the same transaction as every write the view
  depends on (migration 0008; see :mod:`hedgerow.controller.store.change_counters`).

On PostgreSQL ``calls`` and ``attempts`` are partitioned by UTC day (migration 0010,
:mod:`hedgerow.controller.store.partitions`), so a few objects differ by database; each carries
``info={"dialect": name}`` and exists only there (:func:`on_dialect` tells Alembic which):

- SQLite: the unique ``request_id`` of ``calls``, the foreign key ``attempts.call_id`` ->
  ``calls.id`` and the unique (``call_id``, ``attempt_index``);
- PostgreSQL: ``call_request_ids``; the primary keys, the unique (``call_id``,
  ``attempt_index``) and the foreign key (``call_id`` -> that day's ``calls`` partition) are
  made on each day partition, not on the partitioned parents (which Alembic does not compare).

Every timestamp is a timezone-aware UTC datetime (:class:`UTCDateTime`), every duration a float
number of seconds with the unit in the column name. Constraint names follow
:data:`NAMING_CONVENTION` so migrations can refer to them on every database.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

__all__ = [
    "NAMING_CONVENTION",
    "Attempt",
    "Base",
    "Call",
    "CallRequestId",
    "ChangeCounter",
    "HourlyRollup",
    "Lease",
    "MinuteAggregate",
    "Price",
    "ReportDelivery",
    "Route",
    "Threshold",
    "ThresholdHistory",
    "UTCDateTime",
    "on_dialect",
    "utc_now",
]

#: Names of indexes and constraints, identical on SQLite and PostgreSQL.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: 64-bit ids on PostgreSQL; SQLite needs INTEGER for its rowid primary keys.
BigId = BigInteger().with_variant(Integer(), "sqlite")


#: ``info`` of a schema object that exists on SQLite only / on PostgreSQL only.
SQLITE_ONLY: dict[str, str] = {"dialect": "sqlite"}
POSTGRESQL_ONLY: dict[str, str] = {"dialect": "postgresql"}


def on_dialect(obj: Any, dialect_name: str) -> bool:
    """Whether the schema object ``obj`` (a table, column, index or constraint of these models)
    exists on ``dialect_name``: objects marked ``info={"dialect": x}`` exist on ``x`` only."""
    info = getattr(obj, "info", None) or {}
    wanted = info.get("dialect")
    return wanted is None or wanted == dialect_name


def utc_now() -> datetime:
    """The current time as a timezone-aware UTC datetime."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime(timezone=True)`` column that only stores and returns aware UTC datetimes.

    PostgreSQL keeps ``timestamp with time zone``; SQLite has no zone type, so values are stored
    as naive UTC text and given back their UTC zone when read.

    Raises:
        ValueError: when a naive datetime is bound (its zone would be a guess).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Check the value is aware and convert it to UTC (naive UTC on SQLite)."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware (UTC); got a naive datetime")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Return the stored value as an aware UTC datetime."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every hedgerow table (shares :data:`NAMING_CONVENTION`)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime()}


class Route(Base):
    """One (route, model) pair and its hedging configuration.

    Attributes:
        route, model: the app's logical route name and the request's model.
        enabled: False stops hedging for this pair (the controller publishes it disabled).
        budget: largest allowed fraction of calls that hedge (0.10 = 10 %).
        default_hedge_after_s: value published while there is too little data, seconds.
        min_hedge_after_s / max_hedge_after_s: bounds of the published value, seconds.
        pinned_hedge_after_s: when set, published as is instead of the controller's value.
        archived_at: when an operator archived the route (aware UTC), or None for a route in
            use. An archived route is left out of the route lists, the threshold table and the
            controller's ticks, does not count against ``max_routes``, and its records are
            refused; its calls and history stay (:mod:`hedgerow.controller.routes_admin`).
        archived_by: who archived it (the actor of the change), or None.
    """

    __tablename__ = "routes"
    __table_args__ = (UniqueConstraint("route", "model"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    route: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    enabled: Mapped[bool] = mapped_column(Boolean)
    budget: Mapped[float] = mapped_column(Float)
    default_hedge_after_s: Mapped[float] = mapped_column(Float)
    min_hedge_after_s: Mapped[float] = mapped_column(Float)
    max_hedge_after_s: Mapped[float] = mapped_column(Float)
    pinned_hedge_after_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    archived_at: Mapped[datetime | None]
    archived_by: Mapped[str | None] = mapped_column(String(200))

    threshold: Mapped[Threshold | None] = relationship(back_populates="route_row", lazy="raise")


class Call(Base):
    """One recorded call: every field of the CallRecord wire format (route/model via ``route_id``).

    ``received_at`` is when the api stored it. ``request_id`` is unique: on SQLite by a unique
    constraint of this table, on PostgreSQL (where the table is partitioned by ``started_at``
    and a unique constraint would have to include it) by :class:`CallRequestId`.
    """

    __tablename__ = "calls"
    __table_args__ = (
        Index(None, "route_id", "started_at"),
        UniqueConstraint("request_id", info=SQLITE_ONLY),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(200))
    route_id: Mapped[int] = mapped_column(BigId, ForeignKey("routes.id", ondelete="CASCADE"))
    started_at: Mapped[datetime]
    received_at: Mapped[datetime]
    client: Mapped[str | None] = mapped_column(String(200))
    hedge_after_s: Mapped[float | None] = mapped_column(Float)
    threshold_version: Mapped[int | None] = mapped_column(BigInteger)
    hedged: Mapped[bool] = mapped_column(Boolean)
    hedge_reason: Mapped[str | None] = mapped_column(String(32))
    hedge_denied: Mapped[bool] = mapped_column(Boolean)
    failover_denied: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: ``chat`` (chat completions) or ``responses`` (the Responses API).
    api: Mapped[str] = mapped_column(String(16), default="chat", server_default="chat")
    winner: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    error_type: Mapped[str | None] = mapped_column(String(200))
    ttft_s: Mapped[float | None] = mapped_column(Float)
    ttfo_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    max_itl_s: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    wasted_completion_tokens: Mapped[int] = mapped_column(Integer)


class Attempt(Base):
    """One attempt of a call, in the record's start order (``attempt_index`` 0, 1, ...).

    ``call_started_at`` is the call's ``started_at``: the partition key on PostgreSQL, so a
    call and its attempts live in the same day and are dropped together. There each day's
    ``attempts`` partition has its foreign key to that day's ``calls`` partition (the SQLite
    foreign key below is on the tables themselves).
    """

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("call_id", "attempt_index", info=SQLITE_ONLY),
        ForeignKeyConstraint(["call_id"], ["calls.id"], ondelete="CASCADE", info=SQLITE_ONLY),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    call_id: Mapped[int] = mapped_column(BigId)
    call_started_at: Mapped[datetime]
    attempt_index: Mapped[int] = mapped_column(Integer)
    upstream: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    start_s: Mapped[float] = mapped_column(Float)
    first_token_s: Mapped[float | None] = mapped_column(Float)
    end_s: Mapped[float] = mapped_column(Float)
    outcome: Mapped[str] = mapped_column(String(16))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(200))
    completion_tokens: Mapped[int] = mapped_column(Integer)
    #: Prompt tokens the attempt cost (its own usage, else the call's: ``prompt_tokens_estimated``).
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Of ``prompt_tokens``, those read from the upstream's prompt cache (when it reports them).
    cached_prompt_tokens: Mapped[int | None] = mapped_column(Integer)


class CallRequestId(Base):
    """The ``request_id`` of a stored call (PostgreSQL only): ingest's unique key.

    ``calls`` is partitioned by day there, and a unique constraint of a partitioned table must
    include its partition key, so ``request_id`` alone cannot be unique in ``calls``; this
    small, unpartitioned table holds it instead, written in the same transaction as the call
    (``INSERT ... ON CONFLICT DO NOTHING`` decides which records are new). Rows are deleted by
    retention once their day's partitions are dropped (``started_at``: the call's, indexed).
    See :mod:`hedgerow.controller.store.partitions` for the alternatives weighed.
    """

    __tablename__ = "call_request_ids"
    __table_args__ = (Index(None, "started_at", postgresql_using="brin"), {"info": POSTGRESQL_ONLY})

    request_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[datetime]


class Threshold(Base):
    """The threshold published for one route (what ``GET /v1/thresholds`` serves).

    Attributes:
        hedge_after_s: the published threshold, seconds.
        enabled: whether clients should hedge this route at all.
        source: ``controller``, ``cold_start`` (a cold route's lowest supported value,
            ``policy`` rule 2), ``default``, ``pinned``, ``disabled`` or ``manual``.
        version: increases by one whenever the published content changes (starts at 1).
        updated_at: when the published content last changed.
    """

    __tablename__ = "thresholds"

    route_id: Mapped[int] = mapped_column(BigId, ForeignKey("routes.id", ondelete="CASCADE"), primary_key=True)
    hedge_after_s: Mapped[float] = mapped_column(Float)
    enabled: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]

    route_row: Mapped[Route] = relationship(back_populates="threshold", lazy="raise")


class ThresholdHistory(Base):
    """One decision about a route's threshold (applied or held), with every input behind it.

    The quantiles are Kaplan-Meier estimates of the primary's TTFT (NULL when the data cannot
    identify them); ``actor`` is NULL for the controller job and names the user of a manual change.

    A hold whose decision and reason equal the previous row's is not a new row: the controller
    updates that row instead (``repeats`` + 1, ``last_at`` = the tick's time, the measured figures
    those of the latest tick), so the history grows with decisions, not ticks.
    ``computed_at`` is the first tick of the row, ``last_at`` its latest (equal when ``repeats``
    is 1).
    """

    __tablename__ = "threshold_history"
    __table_args__ = (Index(None, "route_id", "computed_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    route_id: Mapped[int] = mapped_column(BigId, ForeignKey("routes.id", ondelete="CASCADE"))
    computed_at: Mapped[datetime]
    previous_hedge_after_s: Mapped[float | None] = mapped_column(Float)
    hedge_after_s: Mapped[float] = mapped_column(Float)
    applied: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(String(400))
    source: Mapped[str] = mapped_column(String(32))
    window_s: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    censored: Mapped[int] = mapped_column(Integer)
    p50_s: Mapped[float | None] = mapped_column(Float)
    p75_s: Mapped[float | None] = mapped_column(Float)
    p90_s: Mapped[float | None] = mapped_column(Float)
    p95_s: Mapped[float | None] = mapped_column(Float)
    p99_s: Mapped[float | None] = mapped_column(Float)
    observed_hedge_rate: Mapped[float | None] = mapped_column(Float)
    backup_win_rate: Mapped[float | None] = mapped_column(Float)
    budget: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(200))
    #: Machine-readable extras (JSON object, or NULL): ``quantile_lower_bounds_s`` (lower bounds
    #: for the quantiles left NULL above), ``changes`` (what a ``config`` row set) and flag inputs.
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: Ticks this row stands for (1, plus one per identical hold merged into it).
    repeats: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: The latest tick the row stands for (aware UTC; ``computed_at`` when ``repeats`` is 1).
    last_at: Mapped[datetime]


class Lease(Base):
    """A named lease: ``holder`` owns it until ``expires_at`` unless it renews it."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime]


class HourlyRollup(Base):
    """The calls of one (route, model) started in one UTC hour, folded into counters and histograms.

    Written by :func:`hedgerow.controller.store.rollups.fold_hours`; raw calls of an hour are deleted
    (:mod:`hedgerow.controller.store.retention`) only once its rollup is ``sealed``. Every counter and
    histogram is additive: the figures of any set of hours are the sums of theirs.

    Attributes:
        hour_start: start of the hour (aware UTC, whole hour); the hour is
            ``[hour_start, hour_start + 1 h)`` of ``calls.started_at``.
        folded_at: when the rollup was last (re)computed.
        sealed_at: when retention began deleting the hour's raw calls (NULL before): a sealed
            rollup is never recomputed, only added to (calls that arrive late, ``id >
            max_call_id``).
        max_call_id: the largest ``calls.id`` folded in (only calls up to it may be deleted).
        calls, ok_calls, error_calls, timeout_calls, stalled_calls, cancelled_calls: calls, and
            calls per ``status`` (they sum to ``calls``).
        hedges: calls hedged because the primary was slow (``hedge_reason = ttft_timeout``).
        hedge_denied: calls whose hedge the budget refused.
        backup_wins: hedged calls whose backup won.
        failovers: calls with a backup because the primary failed (``primary_error``).
        prompt_tokens, completion_tokens, wasted_completion_tokens: token sums.
        primary_samples, primary_censored: primary TTFT samples (censored included) and censored.
        histogram_scheme: bucket layout of the histograms
            (:data:`hedgerow.controller.policy.ttft_histogram.HISTOGRAM_SCHEME`).
        primary_ttft_hist: sparse ``{"bucket": count}`` of the primary's observed TTFTs.
        primary_censored_hist: the same of censored primaries (at their elapsed time).
        call_ttft_hist: the same of the call's TTFT as the app saw it (with hedging).
        fold_version: the fold rules the row was computed with
            (:data:`hedgerow.controller.store.rollups.FOLD_VERSION`); an unsealed row of an older
            version is recomputed by a process's first fold, which reads every complete hour
            (later folds of the same process read only changed hours; rows folded before
            migration 0004 are 1).
        primary_prompt_tokens .. extra_completion_tokens: prompt and completion tokens of the
            primary attempts, of the backup attempts, and of the extra attempts (every attempt
            that did not win, in a call with more than one attempt: what hedging cost).
        cached_prompt_tokens, estimated_prompt_tokens: of all attempts' prompt tokens, those
            read from a prompt cache, and those estimated from the call's prompt tokens.
        tpot_hist, e2e_hist: sparse histograms of the calls' TPOT and e2e.
        upstream_tokens: ``{upstream: {"prompt": n, "cached": n, "completion": n,
            "extra_prompt": n, "extra_cached": n, "extra_completion": n}}``, what prices apply to.
    """

    __tablename__ = "hourly_rollups"
    __table_args__ = (UniqueConstraint("route_id", "hour_start"), Index(None, "hour_start"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    route_id: Mapped[int] = mapped_column(BigId, ForeignKey("routes.id", ondelete="CASCADE"))
    hour_start: Mapped[datetime]
    folded_at: Mapped[datetime]
    sealed_at: Mapped[datetime | None]
    max_call_id: Mapped[int] = mapped_column(BigInteger)
    calls: Mapped[int] = mapped_column(Integer)
    ok_calls: Mapped[int] = mapped_column(Integer)
    error_calls: Mapped[int] = mapped_column(Integer)
    timeout_calls: Mapped[int] = mapped_column(Integer)
    stalled_calls: Mapped[int] = mapped_column(Integer)
    cancelled_calls: Mapped[int] = mapped_column(Integer)
    hedges: Mapped[int] = mapped_column(Integer)
    hedge_denied: Mapped[int] = mapped_column(Integer)
    backup_wins: Mapped[int] = mapped_column(Integer)
    failovers: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    wasted_completion_tokens: Mapped[int] = mapped_column(BigInteger)
    primary_samples: Mapped[int] = mapped_column(Integer)
    primary_censored: Mapped[int] = mapped_column(Integer)
    histogram_scheme: Mapped[str] = mapped_column(String(64))
    primary_ttft_hist: Mapped[dict[str, int]] = mapped_column(JSON)
    primary_censored_hist: Mapped[dict[str, int]] = mapped_column(JSON)
    call_ttft_hist: Mapped[dict[str, int]] = mapped_column(JSON)
    fold_version: Mapped[int] = mapped_column(Integer, default=1)
    primary_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    primary_completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    backup_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    backup_completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    extra_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    extra_completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    estimated_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    tpot_hist: Mapped[dict[str, int] | None] = mapped_column(JSON)
    e2e_hist: Mapped[dict[str, int] | None] = mapped_column(JSON)
    upstream_tokens: Mapped[dict[str, dict[str, int]] | None] = mapped_column(JSON)


class MinuteAggregate(Base):
    """The calls of one (route, model) started in one UTC minute, as the controller's tick reads them.

    Written by ingest in the same transaction as the calls (only calls that batch inserted; see
    :mod:`hedgerow.controller.store.minute_store`), backfilled by migration 0011, deleted by retention
    once older than the tick's widest window (``max_window_s``). Every field is additive: the
    figures of any set of minutes are the sums of theirs. The sample rules are those of
    :mod:`hedgerow.controller.policy.minute_counts`.

    Attributes:
        route_id: the ``routes.id``.
        minute_index: whole minutes from 1970-01-01 UTC; the minute is ``[60 * minute_index,
            60 * minute_index + 60)`` seconds of ``calls.started_at``.
        calls: calls stored.
        hedged: calls hedged because the primary was slow (``hedge_reason = ttft_timeout``).
        backup_wins: hedged calls whose backup won.
        denied: calls whose wanted hedge the client's bucket denied (``hedge_denied``).
        wanted: calls hedged or denied.
        histograms: sparse TTFT histograms of five kinds (primary observed and censored, backup
            observed and censored, call TTFT) in the bucket scheme
            :data:`hedgerow.controller.policy.ttft_histogram.HISTOGRAM_SCHEME`, encoded as sorted
            little-endian uint32 ``(kind * 330 + bucket, count)`` pairs
            (:func:`hedgerow.controller.policy.minute_counts.encode`).
    """

    __tablename__ = "minute_aggregates"
    __table_args__ = (Index(None, "minute_index"),)

    route_id: Mapped[int] = mapped_column(BigId, ForeignKey("routes.id", ondelete="CASCADE"), primary_key=True)
    minute_index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    calls: Mapped[int] = mapped_column(Integer)
    hedged: Mapped[int] = mapped_column(Integer)
    backup_wins: Mapped[int] = mapped_column(Integer)
    denied: Mapped[int] = mapped_column(Integer)
    wanted: Mapped[int] = mapped_column(Integer)
    histograms: Mapped[bytes] = mapped_column(LargeBinary)


class Price(Base):
    """A price of a model's tokens, in force from ``effective_from`` until the next row's.

    Rows are only ever added: a correction for the same ``effective_from`` is a newer row (the
    newest ``created_at`` wins), so the table is the audit trail of every price set.

    Attributes:
        model: the model (as in ``routes.model``).
        upstream: the upstream it applies to, or ``""`` for every upstream without a price of
            its own (an empty string rather than NULL, so the unique key works everywhere).
        effective_from: the whole UTC hour from which it applies.
        input_usd_per_mtok / output_usd_per_mtok: USD per million prompt / completion tokens.
        cached_input_usd_per_mtok: USD per million prompt tokens read from a prompt cache, or
            NULL (they cost the input price).
        source: ``api`` or ``file`` (the price file loaded at start).
        actor: who set it (the api caller, or the file's path).
        created_at: when it was set.
    """

    __tablename__ = "prices"
    __table_args__ = (Index(None, "model", "upstream", "effective_from"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200))
    upstream: Mapped[str] = mapped_column(String(200))
    effective_from: Mapped[datetime]
    input_usd_per_mtok: Mapped[float] = mapped_column(Float)
    output_usd_per_mtok: Mapped[float] = mapped_column(Float)
    cached_input_usd_per_mtok: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(400))
    created_at: Mapped[datetime]


class ReportDelivery(Base):
    """One scheduled delivery of a report, claimed before it is sent (never sent twice).

    Attributes:
        kind: ``weekly``; period: the ISO week (``2026-W48``).
        claimed_by: the holder id of the process that claimed it; claimed_at: when.
        status: ``sending``, ``sent`` or ``failed``; attempts: webhook attempts made.
        files: JSON list of the files written; error: the last error (or NULL).
        finished_at: when it was sent or given up (NULL while sending).
    """

    __tablename__ = "report_deliveries"
    __table_args__ = (UniqueConstraint("kind", "period"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    period: Mapped[str] = mapped_column(String(32))
    claimed_by: Mapped[str] = mapped_column(String(200))
    claimed_at: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    files: Mapped[list[str] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(String(1000))
    finished_at: Mapped[datetime | None]


class ChangeCounter(Base):
    """A counter raised by database triggers whenever the data behind a cached view changes.

    Attributes:
        name: the view (``threshold_table``: the body of ``GET /v1/thresholds``).
        version: raised by one in the transaction of every insert, update or delete it watches,
            so a reader that sees the same version sees the same data (one primary-key read).
    """

    __tablename__ = "change_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)
