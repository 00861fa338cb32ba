"""hedgerow.controller: the SQL store, TTFT estimation, the threshold policy and the controller job.

- store: :mod:`~hedgerow.controller.store.models` (SQLAlchemy 2 tables), :mod:`~hedgerow.controller.store.db`
  (engines, sessions, Alembic migrations), :mod:`~hedgerow.controller.store.ingest` (call records in),
  :mod:`~hedgerow.controller.store.queries` (thresholds, routes, history out);
- estimation: :mod:`~hedgerow.controller.policy.estimation` (Kaplan-Meier TTFT quantiles, scipy);
  :mod:`~hedgerow.controller.policy.hedge_model` (predicted P99 of hedged calls over a threshold grid);
- policy: :mod:`~hedgerow.controller.policy.policy` (one objective under the budget bound, as ordered
  rules over the estimation's curves; window rules and drift detection behind it);
- job: :mod:`~hedgerow.controller.jobs` (one tick), :mod:`~hedgerow.controller.lease` (one job
  runner), :mod:`~hedgerow.controller.scheduler` (APScheduler);
- history: :mod:`~hedgerow.controller.store.rollups` (hourly rollups, weekly merges, histogram
  quantiles via :mod:`~hedgerow.controller.policy.ttft_histogram`), :mod:`~hedgerow.controller.store.retention`
  (deletes raw calls once rolled up); :mod:`~hedgerow.controller.policy.minute_counts` and
  :mod:`~hedgerow.controller.store.minute_store` (per-minute aggregates kept by ingest),
  :func:`read_minutes` (all routes' minutes of a span, for the tick).

No FastAPI here: the api imports this package, never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hedgerow._lazy import lazy_getattr

if TYPE_CHECKING:
    from hedgerow.controller.errors import ControllerError, StoreError, StoreNotReady, UnknownRoute
    from hedgerow.controller.jobs import run_once, run_tick, tick_route
    from hedgerow.controller.lease import CONTROLLER_LEASE, acquire_lease, release_lease
    from hedgerow.controller.policy.estimation import TTFTEstimate, estimate_ttft
    from hedgerow.controller.policy.hedge_model import EfficientChoice, efficient_threshold, km_survival
    from hedgerow.controller.policy.policy import Decision, Observation, PolicyKnobs, RouteConfig, decide
    from hedgerow.controller.routes_admin import (
        ROUTE_CONFIG_FIELDS,
        RouteConfigInvalid,
        configure_route,
        update_route,
    )
    from hedgerow.controller.scheduler import ControllerScheduler
    from hedgerow.controller.store._minute_window import RouteMinutes, read_minutes
    from hedgerow.controller.store.db import (
        check_ready,
        downgrade_database,
        make_engine,
        make_sessionmaker,
        upgrade_connection,
        upgrade_database,
    )
    from hedgerow.controller.store.ingest import ingest_calls, route_defaults
    from hedgerow.controller.store.models import (
        Attempt,
        Base,
        Call,
        HourlyRollup,
        Lease,
        MinuteAggregate,
        Route,
        Threshold,
        ThresholdHistory,
    )
    from hedgerow.controller.store.queries import (
        HISTORY_FIELDS,
        THRESHOLD_FIELDS,
        get_history,
        get_route,
        get_threshold,
        list_routes,
        list_thresholds,
    )
    from hedgerow.controller.store.retention import (
        RetentionReport,
        run_retention,
        run_retention_once,
    )
    from hedgerow.controller.store.rollups import Rollup, RouteRollup, fold_hours, merge_rollups

#: Where each public name lives. The facade imports a submodule on first use (PEP 562), so that
#: importing the store (``hedgerow.controller.store.models``, the CLI, Alembic) does not load scipy.
_LOCATION = {
    "check_ready": "hedgerow.controller.store.db",
    "downgrade_database": "hedgerow.controller.store.db",
    "make_engine": "hedgerow.controller.store.db",
    "make_sessionmaker": "hedgerow.controller.store.db",
    "upgrade_connection": "hedgerow.controller.store.db",
    "upgrade_database": "hedgerow.controller.store.db",
    "ControllerError": "hedgerow.controller.errors",
    "StoreError": "hedgerow.controller.errors",
    "StoreNotReady": "hedgerow.controller.errors",
    "UnknownRoute": "hedgerow.controller.errors",
    "TTFTEstimate": "hedgerow.controller.policy.estimation",
    "estimate_ttft": "hedgerow.controller.policy.estimation",
    "EfficientChoice": "hedgerow.controller.policy.hedge_model",
    "efficient_threshold": "hedgerow.controller.policy.hedge_model",
    "km_survival": "hedgerow.controller.policy.hedge_model",
    "RouteMinutes": "hedgerow.controller.store._minute_window",
    "read_minutes": "hedgerow.controller.store._minute_window",
    "ingest_calls": "hedgerow.controller.store.ingest",
    "route_defaults": "hedgerow.controller.store.ingest",
    "run_once": "hedgerow.controller.jobs",
    "run_tick": "hedgerow.controller.jobs",
    "tick_route": "hedgerow.controller.jobs",
    "CONTROLLER_LEASE": "hedgerow.controller.lease",
    "acquire_lease": "hedgerow.controller.lease",
    "release_lease": "hedgerow.controller.lease",
    "Attempt": "hedgerow.controller.store.models",
    "Base": "hedgerow.controller.store.models",
    "Call": "hedgerow.controller.store.models",
    "HourlyRollup": "hedgerow.controller.store.models",
    "Lease": "hedgerow.controller.store.models",
    "MinuteAggregate": "hedgerow.controller.store.models",
    "Route": "hedgerow.controller.store.models",
    "Threshold": "hedgerow.controller.store.models",
    "ThresholdHistory": "hedgerow.controller.store.models",
    "Decision": "hedgerow.controller.policy.policy",
    "Observation": "hedgerow.controller.policy.policy",
    "PolicyKnobs": "hedgerow.controller.policy.policy",
    "RouteConfig": "hedgerow.controller.policy.policy",
    "decide": "hedgerow.controller.policy.policy",
    "HISTORY_FIELDS": "hedgerow.controller.store.queries",
    "THRESHOLD_FIELDS": "hedgerow.controller.store.queries",
    "get_history": "hedgerow.controller.store.queries",
    "get_route": "hedgerow.controller.store.queries",
    "get_threshold": "hedgerow.controller.store.queries",
    "list_routes": "hedgerow.controller.store.queries",
    "list_thresholds": "hedgerow.controller.store.queries",
    "RetentionReport": "hedgerow.controller.store.retention",
    "run_retention": "hedgerow.controller.store.retention",
    "run_retention_once": "hedgerow.controller.store.retention",
    "Rollup": "hedgerow.controller.store.rollups",
    "RouteRollup": "hedgerow.controller.store.rollups",
    "fold_hours": "hedgerow.controller.store.rollups",
    "merge_rollups": "hedgerow.controller.store.rollups",
    "ROUTE_CONFIG_FIELDS": "hedgerow.controller.routes_admin",
    "RouteConfigInvalid": "hedgerow.controller.routes_admin",
    "configure_route": "hedgerow.controller.routes_admin",
    "update_route": "hedgerow.controller.routes_admin",
    "ControllerScheduler": "hedgerow.controller.scheduler",
}


#: Imports the public name from its submodule on first access (PEP 562).
__getattr__ = lazy_getattr(globals(), _LOCATION)


__all__ = [
    "CONTROLLER_LEASE",
    "HISTORY_FIELDS",
    "ROUTE_CONFIG_FIELDS",
    "THRESHOLD_FIELDS",
    "Attempt",
    # store
    "Base",
    "Call",
    # errors
    "ControllerError",
    "ControllerScheduler",
    "Decision",
    "EfficientChoice",
    # rollups and retention
    "HourlyRollup",
    "Lease",
    "MinuteAggregate",
    "Observation",
    "PolicyKnobs",
    "RetentionReport",
    "Rollup",
    "Route",
    "RouteConfig",
    "RouteConfigInvalid",
    "RouteMinutes",
    "RouteRollup",
    "StoreError",
    "StoreNotReady",
    # estimation and policy
    "TTFTEstimate",
    "Threshold",
    "ThresholdHistory",
    "UnknownRoute",
    "acquire_lease",
    "check_ready",
    "configure_route",
    "decide",
    "downgrade_database",
    "efficient_threshold",
    "estimate_ttft",
    "fold_hours",
    "get_history",
    "get_route",
    "get_threshold",
    "ingest_calls",
    "km_survival",
    "list_routes",
    "list_thresholds",
    "make_engine",
    "make_sessionmaker",
    "merge_rollups",
    "read_minutes",
    "release_lease",
    "route_defaults",
    "run_once",
    "run_retention",
    "run_retention_once",
    # job
    "run_tick",
    "tick_route",
    "update_route",
    "upgrade_connection",
    "upgrade_database",
]  # fmt: skip
