"""All server-side settings of hedgerow in one pydantic-settings object.

Every field is read from an environment variable named ``HEDGEROW_<FIELD>`` (for example
``HEDGEROW_DATABASE_URL``, ``HEDGEROW_CONTROLLER_INTERVAL_S``); command-line flags override them.
Durations are float seconds, fractions are in [0, 1]. The hedging client does not read these
settings: an app embeds the client and configures it in code (``HedgePolicy``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hedgerow.client.records import MAX_SECONDS

__all__ = ["DEFAULT_DATABASE_URL", "MAX_RETENTION_S", "Settings"]

#: The embedded default store: a SQLite file in the working directory.
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./hedgerow.db"
#: Longest raw-call retention, seconds (100 Julian years: the cutoff date stays after 1900).
MAX_RETENTION_S = 100 * 365.25 * 86_400


class Settings(BaseSettings):
    """Settings of the store, the controller job and the api.

    Attributes (environment variable ``HEDGEROW_`` + upper-cased name):
        database_url: SQLAlchemy URL of the store (``sqlite+aiosqlite:///path`` or
            ``postgresql+asyncpg://user@host/db``; plain ``sqlite:///path`` and
            ``postgresql://...`` are mapped to those async drivers).
        controller_interval_s: seconds between two controller ticks (default 60).
        controller_tick_in: where ``serve`` computes a tick: ``"process"`` (default) in a worker
            process of its own, started 30 s after ``serve`` (half an interval if shorter) or at
            the first tick, and kept, so that the tick's computation never holds the api's
            interpreter lock; ``"loop"`` on the api's event loop and its threads. An in-memory
            SQLite store ticks on the loop (a worker cannot open it). ``hedgerow controller
            run-once`` always ticks in its own process.
        controller_observe: what a tick reads of each route's calls: ``"raw"`` (default) the
            minute aggregates before the minute preceding the tick's and the calls since then
            one by one (60-120 s of calls, so its cost grows with the traffic); ``"bounded"``
            the minute aggregates of the whole window, the current partial minute included, and
            only each route's latest ``RECENT_CALLS`` (100) calls one by one, their minutes'
            counts taken out of the aggregates (``controller/store/_minute_window.py``), so the
            cost per route is flat in its calls. Every duration is read at its histogram
            bucket's end either way (at most one bucket, 4.7 %, above the raw sample).
        window_s: the estimation window, seconds of recent calls per tick (default 3600).
        max_window_s: how far the window may widen while samples are too few (default 86400).
        short_window_s: the window in which an observed hedge rate above budget raises the
            threshold at once (default 300).
        min_samples: fewest primary TTFT samples for a decision (default 50).
        confidence: level of the Kaplan-Meier pointwise confidence interval (default 0.95).
        hysteresis: relative change below which the published value is held (default 0.05).
        max_step_down: largest relative decrease per tick (default 0.25, i.e. to 75%).
        tail_quantile: the call TTFT quantile the controller's objective minimises (default 0.99).
        drift_alpha: false-alarm level of the controller's drift test (log-rank between the
            recent minutes and the window; default 0.001; 0 turns it off).
        drift_min_ratio: smallest ratio of the two parts' KM median TTFTs that counts as a
            change of the distribution (default 1.75).
        default_budget: budget of a route created on first ingest (default 0.10).
        default_hedge_after_s / min_hedge_after_s / max_hedge_after_s: a new route's threshold
            and bounds (defaults 2.0 s, 0.05 s, 30 s); checked at start: min <= default <= max <=
            86400 s (``MAX_SECONDS``, the longest duration a call record carries), and
            ``short_window_s <= window_s <= max_window_s``, errors naming the variables.
        min_backup_win_rate: below this backup win rate a route is flagged (default 0.2).
        min_hedges_for_flag: fewest hedged calls in the window before a route can be flagged
            (``backups_rarely_win``, ``hedges_did_not_lower_p99``) (default 20).
        short_window_min_calls: fewest calls in the short window before its hedge rate is
            trusted (default 20).
        min_p99_improvement: fraction by which the call-level P99 TTFT (with hedging) must be
            below the primary's KM P99 (without hedging); otherwise the route is flagged
            ``hedges_did_not_lower_p99`` (default 0.05).
        p99_tolerance: relative slack on the predicted call-level P99 TTFT within which the
            controller prefers a higher threshold than the budget target (fewer hedges for
            nearly the same tail; ``hedgerow.controller.policy.hedge_model``); 0 keeps only exact ties
            (default 0.02, i.e. 2%).
        min_backup_samples: fewest backup TTFT samples in the window for the backup's own
            survival curve in that prediction; with fewer, the primary's curve stands in
            (default 20).
        client_budget_burst: capacity, in hedges, of the clients' hedge token bucket
            (``HedgePolicy.budget_burst``) that this prediction replays over the window's calls
            to count the hedges a threshold would get denied; 0 leaves denials out (default 10,
            the client's default).
        replay_max_calls: most of the window's latest calls that bucket replay runs over (the
            policy's rules 2 and 3); its cost grows with them, the survival curves it combines
            come from the whole window (default 4000).
        lease_ttl_s: lifetime of the job-runner lease; the holder renews it every tick and at
            least every third of the TTL (default 30).
        max_batch_calls: largest batch accepted by ``POST /v1/calls`` (default 1000).
        retention_s: age after which raw calls and attempts are deleted, seconds (default
            1,209,600 = 14 days); only whole UTC hours whose hourly rollup is written, so weekly
            figures survive (on PostgreSQL whole days, dropped an hour after the day is this
            old). Must be >= ``max_window_s`` (the controller reads raw calls). The api refuses
            records that started longer ago than this.
        rollup_interval_s: seconds between two runs of the rollup + retention job on the
            lease holder (default 3600; the first run is 60 s after start, or sooner).
        retention_batch_rows: most calls (with their attempts) deleted per transaction
            (default 2000, at most 10000).
        price_file: a price file (JSON, or TOML by its suffix; see
            :mod:`hedgerow.controller.store.prices`) loaded into the store when the api starts;
            empty: none (default). Re-loading the same file adds nothing.
        report_cron: when the weekly report job runs on the lease holder, a crontab line in UTC
            (default ``10 0 * * mon``: Monday 00:10 UTC; it also runs once soon after start); it
            reports the ISO week that just ended (:mod:`hedgerow.controller.report.report_job`). The job
            runs only when ``report_dir`` or ``report_webhook_url`` is set.
        report_dir: directory the job writes ``hedgerow-weekly-<week>.<format>`` into (created
            when missing; empty: no files, the default).
        report_formats: comma-separated formats the job writes (default ``html,json``; any of
            json, csv, html, md).
        report_webhook_url: where the job posts the report (empty: nowhere, the default).
        report_webhook_format: ``slack`` (``{"text": summary}``, default) or ``json`` (the report).
        report_webhook_attempts: attempts of the post before the delivery is marked failed
            (default 5); report_webhook_backoff_s: the wait before the second attempt, doubled
            for each further one (default 2 s); report_webhook_timeout_s: per attempt (10 s).
        flag_webhook_url: where the lease holder posts each tick's flag changes (a route's
            ``backups_rarely_win``, ``hedges_did_not_lower_p99`` or ``raise_over_budget`` raised or
            cleared; :mod:`hedgerow.controller.flag_webhook`), in ``report_webhook_format`` with the
            report's attempts, backoff and timeout; may be the report's URL (empty: off, the default).
        report_cache_ttl_s: how long ``serve`` keeps a weekly report it built (api and console, each
            week and format), seconds; requests meanwhile get that copy, so a report costs its
            build (seconds of CPU for HTML) at most once per week and format in that time
            (default 300; 0: build every time).
        host / port: where ``hedgerow serve`` listens (defaults 127.0.0.1:8400).
        tokens: bearer tokens, ``[name=]token:scope1+scope2`` comma-separated (empty = no auth,
            loopback only); a token's name is the audit actor of the changes made with it.
        allowed_hosts: comma-separated host names or addresses (no ports) the api answers to in
            the ``Host`` header besides the loopback names (``localhost``, 127.0.0.1, ``[::1]``)
            and a concrete ``host``; ``*``: any. Other hosts get 400. Empty with a wildcard
            ``host`` (0.0.0.0, ::): any host (tokens are then required); default empty.
        allowed_origins: comma-separated origins (``https://ops.example``) whose state-changing
            requests (a browser's ``Origin``) are accepted besides the server's own; default empty.
        log_level: ``debug``, ``info`` (default), ``warning``, ``error`` or ``critical``.
        log_format: ``text`` (default) or ``json`` (one object per line).
        access_log: log one line per HTTP request (default false).
        max_body_bytes: largest body of ``POST /v1/calls``, bytes (default 16 MiB; the smaller of
            this and ``max_batch_calls`` x 16 KiB applies); refused with 413 while it streams.
        header_read_timeout_s: seconds a request's line and headers may take before the
            connection is closed (default 10).
        body_read_timeout_s: seconds a request's whole body may take after its headers before
            it is answered 408 (default 30).
        shutdown_timeout_s: on SIGTERM, seconds ``hedgerow serve`` waits for requests in flight
            before cancelling them (default 10; rounded up to whole seconds for uvicorn). The
            controller lease is released at once, before this wait.
        max_routes: most (route, model) rows in the store; a batch or PUT that would create more
            is refused with 422 naming the field (default 1000).
        max_models_per_route: most models of one route name (default 20).
        history_retention_s: age after which held (not applied) threshold history rows are
            deleted, seconds (default 2,592,000 = 30 days).
        applied_history_retention_s: age after which applied changes are deleted from the
            threshold history, seconds (default 31,536,000 = 365 days; >= ``history_retention_s``).
        threshold_check_interval_s: seconds between two reads of the store's change counter by
            a process serving ``GET /v1/thresholds`` from memory (default 1; 0 reads it on every
            poll): how late a change made by another ``serve`` process may be served.
        migration_lock_timeout_s: longest wait of ``hedgerow db upgrade`` and ``hedgerow serve``
            for the store's migration lock (another process migrating it; on SQLite also a long
            write), seconds, before failing with a message naming the store (default 600).
        report_delivery_runs: most delivery runs of one week's report: the first and its retries
            (default 6); each run posts up to ``report_webhook_attempts`` times.
        report_retry_backoff_s: wait after a failed run before the next one, seconds, doubled
            after each further failed run (default 600: runs 10, 20, 40, 80 min apart).
        report_sending_stale_s: age of a claim still ``sending`` after which the process that
            claimed it is taken to have died mid-delivery and the week is delivered again,
            seconds (default 3600; at least twice the longest run of webhook posts).
        report_retry_interval_s: seconds between two looks of the lease holder for deliveries
            due to be retried (default 300).
        db_pool_size: PostgreSQL: connections of a ``serve`` process's pool for the api's reads
            and writes other than ingest (threshold polls, ``/readyz``, console, admin) (default
            10). Each process also keeps pools of ``db_ingest_pool_size`` and
            ``db_jobs_pool_size`` connections and 2 for the controller lease, so it opens at most
            ``db_pool_size + db_ingest_pool_size + db_jobs_pool_size + 2`` (default 19); ingest
            fills only its own pool (:func:`hedgerow.controller.store.db.make_store_engines`).
            SQLite: unused (one engine, as SQLAlchemy sizes it).
        db_ingest_pool_size: PostgreSQL: connections of the ingest pool, which is also the most
            ``POST /v1/calls`` batches one process validates and writes at once (default 4); a
            batch arriving while all are taken waits up to ``ingest_wait_s`` for its turn.
        db_jobs_pool_size: PostgreSQL: connections of the pool of the lease holder's jobs
            (tick, rollup and retention, weekly report) (default 3).
        ingest_wait_s: PostgreSQL: seconds a ``POST /v1/calls`` batch may wait for an ingest
            slot before it is answered 503 with ``Retry-After`` (the exporter keeps the batch and
            posts it again after its backoff) (default 10; 0 answers 503 at once when all are
            taken).
        ingest_cpu_slots: PostgreSQL: most admitted ``POST /v1/calls`` batches in a CPU-heavy
            step (validation, building rows, minute counts) at once, each cut into short slices
            (:mod:`hedgerow.controller.store.cpu_turns`), so a threshold poll waits behind at
            most that many slices; their database waits still overlap (default 1; 0: no bound,
            every admitted batch computes at once).
    """

    model_config = SettingsConfigDict(env_prefix="HEDGEROW_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    controller_interval_s: float = Field(60.0, gt=0)
    controller_tick_in: Literal["process", "loop"] = "process"
    controller_observe: Literal["raw", "bounded"] = "raw"
    threshold_check_interval_s: float = Field(1.0, ge=0, allow_inf_nan=False)
    window_s: float = Field(3600.0, gt=0)
    max_window_s: float = Field(86400.0, gt=0)
    short_window_s: float = Field(300.0, gt=0)
    min_samples: int = Field(50, ge=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    hysteresis: float = Field(0.05, ge=0, lt=1)
    max_step_down: float = Field(0.25, ge=0, lt=1)
    tail_quantile: float = Field(0.99, gt=0.5, lt=1)
    drift_alpha: float = Field(0.001, ge=0, lt=1)
    drift_min_ratio: float = Field(1.75, ge=1)
    default_budget: float = Field(0.10, allow_inf_nan=False)
    default_hedge_after_s: float = Field(2.0, gt=0)
    min_hedge_after_s: float = Field(0.05, gt=0)
    max_hedge_after_s: float = Field(30.0, gt=0)
    min_backup_win_rate: float = Field(0.2, ge=0, le=1)
    min_hedges_for_flag: int = Field(20, ge=0)
    short_window_min_calls: int = Field(20, ge=1)
    min_p99_improvement: float = Field(0.05, ge=0, lt=1)
    p99_tolerance: float = Field(0.02, ge=0)
    min_backup_samples: int = Field(20, ge=1)
    client_budget_burst: float = Field(10.0, ge=0)
    replay_max_calls: int = Field(4000, ge=1)
    lease_ttl_s: float = Field(30.0, gt=0)
    max_batch_calls: int = Field(1000, ge=1)
    retention_s: float = Field(1_209_600.0, gt=0)
    rollup_interval_s: float = Field(3600.0, gt=0)
    retention_batch_rows: int = Field(2000, ge=1, le=10_000)
    price_file: str = ""
    report_cron: str = "10 0 * * mon"
    report_dir: str = ""
    report_formats: str = "html,json"
    report_webhook_url: str = ""
    report_webhook_format: str = "slack"
    report_webhook_attempts: int = Field(5, ge=1, le=20)
    report_webhook_backoff_s: float = Field(2.0, ge=0, le=3600)
    report_webhook_timeout_s: float = Field(10.0, gt=0, le=600)
    flag_webhook_url: str = ""
    report_cache_ttl_s: float = Field(300.0, ge=0, le=86_400)
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=0, le=65535)
    tokens: str = ""
    allowed_hosts: str = ""
    allowed_origins: str = ""
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    header_read_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    body_read_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    shutdown_timeout_s: float = Field(10.0, ge=0, allow_inf_nan=False)
    max_routes: int = Field(1000, ge=1)
    max_models_per_route: int = Field(20, ge=1)
    history_retention_s: float = Field(2_592_000.0, gt=0, le=MAX_RETENTION_S, allow_inf_nan=False)
    applied_history_retention_s: float = Field(31_536_000.0, gt=0, le=MAX_RETENTION_S, allow_inf_nan=False)
    migration_lock_timeout_s: float = Field(600.0, gt=0, le=86_400, allow_inf_nan=False)
    report_delivery_runs: int = Field(6, ge=1, le=100)
    report_retry_backoff_s: float = Field(600.0, ge=0, le=86_400, allow_inf_nan=False)
    report_sending_stale_s: float = Field(3600.0, gt=0, le=7 * 86_400, allow_inf_nan=False)
    report_retry_interval_s: float = Field(300.0, gt=0, le=86_400, allow_inf_nan=False)
    db_pool_size: int = Field(10, ge=1, le=1000)
    db_ingest_pool_size: int = Field(4, ge=1, le=1000)
    db_jobs_pool_size: int = Field(3, ge=1, le=1000)
    ingest_wait_s: float = Field(10.0, ge=0, le=3600, allow_inf_nan=False)
    ingest_cpu_slots: int = Field(1, ge=0, le=1000)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        """Accept the level in any case (``INFO``, ``info``)."""
        return value.lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        """Map a plain ``sqlite:///`` or ``postgresql://`` url to its async driver."""
        from hedgerow.controller.store.db import async_database_url

        return async_database_url(value)

    @field_validator("report_cron")
    @classmethod
    def _check_report_cron(cls, value: str) -> str:
        """Refuse a crontab line APScheduler cannot read."""
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except ValueError as exc:
            raise ValueError(
                f"HEDGEROW_REPORT_CRON {value!r} is not a crontab line (minute hour day month weekday): {exc}"
            ) from None
        return value

    @field_validator("report_formats")
    @classmethod
    def _check_report_formats(cls, value: str) -> str:
        """Refuse an unknown report format."""
        known = ("json", "csv", "html", "md")
        formats = [part.strip() for part in value.split(",") if part.strip()]
        bad = [part for part in formats if part not in known]
        if bad or not formats:
            raise ValueError(f"HEDGEROW_REPORT_FORMATS must list formats out of {', '.join(known)}, got {value!r}")
        return ",".join(formats)

    @field_validator("report_webhook_format")
    @classmethod
    def _check_webhook_format(cls, value: str) -> str:
        """Refuse a webhook format other than slack or json."""
        if value not in ("slack", "json"):
            raise ValueError(f"HEDGEROW_REPORT_WEBHOOK_FORMAT must be slack or json, got {value!r}")
        return value

    @field_validator("default_budget")
    @classmethod
    def _check_default_budget(cls, value: float) -> float:
        """Refuse a default budget that no route could take: the routes' own rule (0 < budget < 1)."""
        from hedgerow.controller.ops_bounds import budget_range_error  # the standard library only

        problem = budget_range_error(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("max_window_s")
    @classmethod
    def _check_max_window(cls, value: float, info: ValidationInfo) -> float:
        """Refuse a widest window narrower than the estimation window."""
        window_s = info.data.get("window_s")
        if window_s is not None and value < window_s:
            raise ValueError(f"HEDGEROW_MAX_WINDOW_S ({value:g} s) must be >= HEDGEROW_WINDOW_S ({window_s:g} s)")
        return value

    @field_validator("short_window_s")
    @classmethod
    def _check_short_window(cls, value: float, info: ValidationInfo) -> float:
        """Refuse a short window longer than the estimation window."""
        window_s = info.data.get("window_s")
        if window_s is not None and value > window_s:
            raise ValueError(f"HEDGEROW_SHORT_WINDOW_S ({value:g} s) must be <= HEDGEROW_WINDOW_S ({window_s:g} s)")
        return value

    @field_validator("max_hedge_after_s")
    @classmethod
    def _check_route_defaults(cls, value: float, info: ValidationInfo) -> float:
        """Refuse defaults of a new route that a route configuration could not hold:
        min <= default <= max <= ``MAX_SECONDS`` (the longest duration a call record carries)."""
        if not value <= MAX_SECONDS:
            raise ValueError(f"HEDGEROW_MAX_HEDGE_AFTER_S ({value:g} s) must be <= {MAX_SECONDS:g} s")
        low = info.data.get("min_hedge_after_s")
        default = info.data.get("default_hedge_after_s")
        if low is not None and low > value:
            raise ValueError(
                f"HEDGEROW_MIN_HEDGE_AFTER_S ({low:g} s) must be <= HEDGEROW_MAX_HEDGE_AFTER_S ({value:g} s)"
            )
        if low is not None and default is not None and not low <= default <= value:
            raise ValueError(
                f"HEDGEROW_DEFAULT_HEDGE_AFTER_S ({default:g} s) must lie within [HEDGEROW_MIN_HEDGE_AFTER_S, "
                f"HEDGEROW_MAX_HEDGE_AFTER_S] = [{low:g}, {value:g}] s"
            )
        return value

    @field_validator("applied_history_retention_s")
    @classmethod
    def _check_applied_history_retention(cls, value: float, info: ValidationInfo) -> float:
        """Applied changes are kept at least as long as held decisions."""
        held_s = info.data.get("history_retention_s")
        if held_s is not None and value < held_s:
            raise ValueError(
                f"HEDGEROW_APPLIED_HISTORY_RETENTION_S ({value:g} s) must be >= "
                f"HEDGEROW_HISTORY_RETENTION_S ({held_s:g} s): applied changes are kept longest"
            )
        return value

    @field_validator("retention_s")
    @classmethod
    def _check_retention(cls, value: float, info: ValidationInfo) -> float:
        """Refuse a retention shorter than the controller's widest window (it needs raw calls),
        or not finite / longer than :data:`MAX_RETENTION_S` (its cutoff date must exist)."""
        if not math.isfinite(value) or value > MAX_RETENTION_S:
            raise ValueError(f"must be a finite number of seconds <= {MAX_RETENTION_S:g} (100 years), got {value:g}")
        max_window_s = info.data.get("max_window_s")
        if max_window_s is not None and value < max_window_s:
            raise ValueError(
                f"must be >= max_window_s ({max_window_s:g} s), got {value:g} s: the controller "
                "estimates thresholds from raw calls that old"
            )
        return value

    @field_validator("report_sending_stale_s")
    @classmethod
    def _check_sending_stale(cls, value: float, info: ValidationInfo) -> float:
        """A claim is taken back only after twice the longest run of webhook posts (timeouts and
        backoff waits), so a live delivery is not taken for a dead one and sent twice."""
        attempts = info.data.get("report_webhook_attempts")
        timeout_s = info.data.get("report_webhook_timeout_s")
        backoff_s = info.data.get("report_webhook_backoff_s")
        if attempts is None or timeout_s is None or backoff_s is None:
            return value
        longest_s = attempts * timeout_s + backoff_s * (2 ** (attempts - 1) - 1)
        if value < 2 * longest_s:
            raise ValueError(
                f"must be >= {2 * longest_s:g} s (twice the longest run of webhook posts: "
                f"{attempts} attempts of up to {timeout_s:g} s with backoff from {backoff_s:g} s), got {value:g} s"
            )
        return value
