"""The api's typed application state: what ``create_app`` puts on ``app.state``, with its types.

Starlette's ``app.state`` is an untyped attribute bag; :func:`app_state` returns the same object
typed as :class:`AppState`, so that a handler's ``app_state(request.app).scheduler`` is checked
by mypy. ``create_app`` (:mod:`hedgerow.api.app`) sets the first group of attributes when the app
is made and the second (the store's engines, the scheduler and the caches) in its lifespan, so
the second group exists only while the app runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from collections import OrderedDict

    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
    from starlette.applications import Starlette

    from hedgerow.api._report_cache import ReportCache
    from hedgerow.api._threshold_cache import ThresholdCache
    from hedgerow.api.ingest_gate import IngestGate
    from hedgerow.api.metrics import Metrics
    from hedgerow.controller.policy.route_config import RouteConfig
    from hedgerow.controller.scheduler import ControllerScheduler
    from hedgerow.controller.store.ingest import RouteIdCache
    from hedgerow.controller.store.partitions import DayPartitionCache
    from hedgerow.settings import Settings

__all__ = ["AppState", "app_state"]


class AppState(Protocol):
    """The attributes of a hedgerow api's ``app.state``.

    Set when the app is made: ``settings``; ``tokens`` (``{token: scopes}``) and ``token_names``
    (``{token: name}``) from ``HEDGEROW_TOKENS``; ``route_defaults`` (a new route's
    configuration); ``route_ids`` and ``partition_days`` (ingest's caches); ``metrics``.

    Set by the lifespan: ``engine`` and ``sessionmaker`` (the api's pool), ``ingest_sessionmaker``
    and ``ingest_gate`` (ingest's pool and its admission, None on SQLite), ``ingest_writer`` (the
    SQLite group-commit writer, None elsewhere), ``scheduler`` (the controller jobs) and
    ``thresholds`` (the poll cache).

    Made on first use (absent before: read them with ``getattr(state, name, None)``):
    ``report_cache`` (the weekly reports, :mod:`hedgerow.api._report_cache`) and
    ``upstream_lines_cache`` (a route page's per-upstream lines, :mod:`hedgerow.api.pages`: by
    (route, model, range), the monotonic time read and the lines).
    """

    settings: Settings
    tokens: dict[str, frozenset[str]]
    token_names: dict[str, str]
    route_defaults: RouteConfig
    route_ids: RouteIdCache
    partition_days: DayPartitionCache
    metrics: Metrics
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    ingest_sessionmaker: async_sessionmaker[AsyncSession]
    ingest_gate: IngestGate | None
    ingest_writer: Any  # GroupCommitWriter[...] | None (hedgerow.api.calls.make_ingest_writer)
    scheduler: ControllerScheduler
    thresholds: ThresholdCache
    report_cache: ReportCache
    upstream_lines_cache: OrderedDict[tuple[str, str, str], tuple[float, dict[str, Any]]]


def app_state(app: Starlette) -> AppState:
    """``app.state``, typed (no copy: the same object)."""
    return cast("AppState", app.state)
