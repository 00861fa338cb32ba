"""hedgerow.controller: the SQL store, TTFT estimation, the threshold policy and the controller job.

- store: :mod:`~hedgerow.controller.models` (SQLAlchemy 2 tables), :mod:`~hedgerow.controller.db`
  (engines, sessions, Alembic migrations), :mod:`~hedgerow.controller.ingest` (call records in),
  :mod:`~hedgerow.controller.queries` (thresholds, routes, history out);
- estimation: :mod:`~hedgerow.controller.estimation` (Kaplan-Meier TTFT quantiles, scipy);
  :mod:`~hedgerow.controller.hedge_model` (predicted P99 of hedged calls over a threshold grid);
- policy: :mod:`~hedgerow.controller.policy` (one objective under the budget bound, as ordered
  rules over the estimation's curves; window rules and drift detection behind it);
- job: :mod:`~hedgerow.controller.jobs` (one tick), :mod:`~hedgerow.controller.lease` (one job
  runner), :mod:`~hedgerow.controller.scheduler` (APScheduler);
- history: :mod:`~hedgerow.controller.rollups` (hourly rollups, weekly merges, histogram
  quantiles via :mod:`~hedgerow.controller.ttft_histogram`), :mod:`~hedgerow.controller.retention`
  (deletes raw calls once rolled up); :mod:`~hedgerow.controller.minute_counts` and
  :mod:`~hedgerow.controller.minute_store` (per-minute aggregates kept by ingest),
  :func:`read_minutes` (all routes' minutes of a span, for the tick).

No FastAPI here: the api imports this package, never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hedgerow._lazy import lazy_getattr

if TYPE_CHECKING:
    from hedgerow.controller._minute_window import RouteMinutes, read_minutes
    from hedgerow.controller.db import (
        check_ready,
        downgrade_database,
        make_engine,
        make_sessionmaker,
        upgrade_connection,
        upgrade_database,
    )
    from hedgerow.controller.errors import ControllerError, StoreError, StoreNotReady, UnknownRoute
    from hedgerow.controller.estimation import TTFTEstimate, estimate_ttft
    from hedgerow.controller.hedge_model import EfficientChoice, efficient_threshold, km_survival
    from hedgerow.controller.ingest import ingest_calls, route_defaults
    from hedgerow.controller.jobs import run_once, run_tick, tick_route
    from hedgerow.controller.lease import CONTROLLER_LEASE, acquire_lease, release_lease
    from hedgerow.controller.models import (
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
    from hedgerow.controller.policy import Decision, Observation, PolicyKnobs, RouteConfig, decide
    from hedgerow.controller.queries import (
        HISTORY_FIELDS,
        THRESHOLD_FIELDS,
        get_history,
        get_route,
        get_threshold,
        list_routes,
        list_thresholds,
    )
    from hedgerow.controller.retention import (
        RetentionReport,
        run_retention,
        run_retention_once,
    )
    from hedgerow.controller.rollups import Rollup, RouteRollup, fold_hours, merge_rollups
    from hedgerow.controller.routes_admin import (
        ROUTE_CONFIG_FIELDS,
        RouteConfigInvalid,
        configure_route,
        update_route,
    )
    from hedgerow.controller.scheduler import ControllerScheduler

#: Where each public name lives. The facade imports a submodule on first use (PEP 562), so that
#: importing the store (``hedgerow.controller.models``, the CLI, Alembic) does not load scipy.
_LOCATION = {
    "check_ready": "hedgerow.controller.db",
    "downgrade_database": "hedgerow.controller.db",
    "make_engine": "hedgerow.controller.db",
    "make_sessionmaker": "hedgerow.controller.db",
    "upgrade_connection": "hedgerow.controller.db",
    "upgrade_database": "hedgerow.controller.db",
    "ControllerError": "hedgerow.controller.errors",
    "StoreError": "hedgerow.controller.errors",
    "StoreNotReady": "hedgerow.controller.errors",
    "UnknownRoute": "hedgerow.controller.errors",
    "TTFTEstimate": "hedgerow.controller.estimation",
    "estimate_ttft": "hedgerow.controller.estimation",
    "EfficientChoice": "hedgerow.controller.hedge_model",
    "efficient_threshold": "hedgerow.controller.hedge_model",
    "km_survival": "hedgerow.controller.hedge_model",
    "RouteMinutes": "hedgerow.controller._minute_window",
    "read_minutes": "hedgerow.controller._minute_window",
    "ingest_calls": "hedgerow.controller.ingest",
    "route_defaults": "hedgerow.controller.ingest",
    "run_once": "hedgerow.controller.jobs",
    "run_tick": "hedgerow.controller.jobs",
    "tick_route": "hedgerow.controller.jobs",
    "CONTROLLER_LEASE": "hedgerow.controller.lease",
    "acquire_lease": "hedgerow.controller.lease",
    "release_lease": "hedgerow.controller.lease",
    "Attempt": "hedgerow.controller.models",
    "Base": "hedgerow.controller.models",
    "Call": "hedgerow.controller.models",
    "HourlyRollup": "hedgerow.controller.models",
    "Lease": "hedgerow.controller.models",
    "MinuteAggregate": "hedgerow.controller.models",
    "Route": "hedgerow.controller.models",
    "Threshold": "hedgerow.controller.models",
    "ThresholdHistory": "hedgerow.controller.models",
    "Decision": "hedgerow.controller.policy",
    "Observation": "hedgerow.controller.policy",
    "PolicyKnobs": "hedgerow.controller.policy",
    "RouteConfig": "hedgerow.controller.policy",
    "decide": "hedgerow.controller.policy",
    "HISTORY_FIELDS": "hedgerow.controller.queries",
    "THRESHOLD_FIELDS": "hedgerow.controller.queries",
    "get_history": "hedgerow.controller.queries",
    "get_route": "hedgerow.controller.queries",
    "get_threshold": "hedgerow.controller.queries",
    "list_routes": "hedgerow.controller.queries",
    "list_thresholds": "hedgerow.controller.queries",
    "RetentionReport": "hedgerow.controller.retention",
    "run_retention": "hedgerow.controller.retention",
    "run_retention_once": "hedgerow.controller.retention",
    "Rollup": "hedgerow.controller.rollups",
    "RouteRollup": "hedgerow.controller.rollups",
    "fold_hours": "hedgerow.controller.rollups",
    "merge_rollups": "hedgerow.controller.rollups",
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
