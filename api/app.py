"""The FastAPI app factory.

``create_app(settings)`` wires the routers and a lifespan that, on start-up, makes the engine,
migrates the store to head, starts (on SQLite) the group commit writer of ``POST /v1/calls`` and
the controller's scheduler (APScheduler 3 ``AsyncIOScheduler``: the lease every ``lease_ttl_s /
3``, a tick every ``controller_interval_s`` while holding the lease); on shut-down it stops the
scheduler, releases the lease, writes the batches still queued and disposes of the engine.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hedgerow import __version__
from hedgerow.api import calls, calls_explorer, controller, health, prices, reports, routes, thresholds
from hedgerow.api import metrics as metrics_api
from hedgerow.api import upstreams as upstreams_api
from hedgerow.api._request_guard import HostPolicy, RequestGuardMiddleware
from hedgerow.api.auth import check_listen_allowed, parse_token_names, parse_tokens
from hedgerow.api.docs import install_docs
from hedgerow.api.ingest_gate import make_ingest_gate
from hedgerow.api.json_body import error_response, unprocessable
from hedgerow.api.json_response import ApiJSONResponse
from hedgerow.api.limits import DEFAULT_BODY_LIMIT_BYTES, BodyLimitMiddleware
from hedgerow.api.metrics import Metrics
from hedgerow.api.openapi import build_openapi
from hedgerow.api.pages import install_pages
from hedgerow.api.path_check import ControlCharacterPathMiddleware
from hedgerow.api.store_errors import STORE_ERRORS, store_unavailable
from hedgerow.controller.errors import AmbiguousModel, UnknownRoute
from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.db import (
    check_database_url,
    make_sessionmaker,
    make_store_engines,
    migrate_engine,
)
from hedgerow.controller.store.ingest import RouteIdCache, route_defaults
from hedgerow.controller.store.partitions import DayPartitionCache
from hedgerow.controller.store.prices import read_price_file, store_price_file
from hedgerow.settings import Settings

__all__ = ["body_limit_for", "create_app", "validation_error_detail"]

log = logging.getLogger(__name__)


def validation_error_detail(exc: RequestValidationError) -> dict[str, str]:
    """The ``detail`` of a 422 for a bad path or query parameter (or a body FastAPI parsed).

    The same shape as the body errors of ``PUT``/``PATCH /v1/routes``: ``{"field": name,
    "message": text}`` for the first error, the field named without its ``path``/``query``/
    ``body`` prefix (``limit``, ``since``, ``model``, ``route``).

    Args:
        exc: the error FastAPI raised while binding the request.

    Returns:
        ``{"field": ..., "message": ...}``.
    """
    errors = exc.errors()
    if not errors:
        return {"field": "request", "message": "invalid request"}
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part not in ("path", "query", "body", "header")]
    field = ".".join(str(part) for part in loc) or "request"
    message = "field required" if first.get("type") == "missing" else str(first.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    return {"field": field, "message": message}


def body_limit_for(settings: Settings) -> Callable[[str, str], int]:
    """The body limit, in bytes, of each endpoint: ``(method, path) -> bytes``.

    ``POST /v1/calls``: the smaller of ``settings.max_body_bytes`` and ``max_batch_calls`` x
    :data:`~hedgerow.api.calls.MAX_RECORD_BYTES`; ``PUT``/``PATCH /v1/routes/...``:
    :data:`~hedgerow.api.routes.MAX_ROUTE_BODY_BYTES`; any other request:
    :data:`~hedgerow.api.limits.DEFAULT_BODY_LIMIT_BYTES`.
    """
    calls_bytes = min(settings.max_body_bytes, settings.max_batch_calls * calls.MAX_RECORD_BYTES)

    def limit_for(method: str, path: str) -> int:
        if method == "POST" and path == "/v1/calls":
            return calls_bytes
        if method in ("PUT", "PATCH") and path.startswith("/v1/routes/"):
            return routes.MAX_ROUTE_BODY_BYTES
        return DEFAULT_BODY_LIMIT_BYTES

    return limit_for


def create_app(settings: Settings | None = None, *, run_scheduler: bool = True) -> FastAPI:
    """Build the hedgerow api.

    Args:
        settings: the server settings (default: from ``HEDGEROW_*`` environment variables).
        run_scheduler: start the controller's scheduled jobs (False: only on demand, through
            ``POST /v1/controller/run``).

    Returns:
        The FastAPI app; its lifespan owns the engine and the scheduler.

    Raises:
        ApiConfigError: malformed ``tokens``, or no tokens while ``settings.host`` is not loopback;
            a malformed ``allowed_hosts`` or ``allowed_origins`` entry.
        StoreError: an unsupported database url.
        ValueError: route defaults out of range (named in the message).
        PriceInvalid: the price file (``settings.price_file``) cannot be read or holds a bad price.
    """
    settings = settings or Settings()
    tokens = parse_tokens(settings.tokens)
    check_listen_allowed(settings.host, tokens)
    host_policy = HostPolicy(settings.host, settings.allowed_hosts, settings.allowed_origins)
    defaults = route_defaults(settings)
    check_database_url(settings.database_url)
    price_specs = read_price_file(settings.price_file) if settings.price_file else []
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # PostgreSQL: a pool each for the api, ingest, the jobs and the lease (hedgerow.controller.store.db)
        engines = make_store_engines(
            settings.database_url,
            api_pool_size=settings.db_pool_size,
            ingest_pool_size=settings.db_ingest_pool_size,
            jobs_pool_size=settings.db_jobs_pool_size,
        )
        engine = engines.api
        sessionmaker = make_sessionmaker(engine)
        scheduler = ControllerScheduler(
            make_sessionmaker(engines.jobs), settings, lease_sessionmaker=make_sessionmaker(engines.lease)
        )
        threshold_cache = thresholds.make_threshold_cache(sessionmaker, settings.threshold_check_interval_s)

        def after_tick(duration_s: float, finished_at_s: float) -> None:
            metrics.observe_tick(duration_s, finished_at_s)
            threshold_cache.invalidate()  # this process may have published: the next poll waits for a check
            threshold_cache.check_soon()  # which starts now

        scheduler.on_tick = after_tick
        scheduler.on_lease = metrics.set_lease
        try:
            await migrate_engine(engine, lock_timeout_s=settings.migration_lock_timeout_s)
            if price_specs:
                await store_price_file(sessionmaker, settings.price_file)
            app.state.engine = engine
            app.state.sessionmaker = sessionmaker
            app.state.scheduler = scheduler
            app.state.thresholds = threshold_cache
            app.state.ingest_sessionmaker = make_sessionmaker(engines.ingest)
            app.state.ingest_gate = make_ingest_gate(
                engine.dialect.name, settings.db_ingest_pool_size, settings.ingest_wait_s, settings.ingest_cpu_slots
            )
            writer = calls.make_ingest_writer(app.state)
            if writer is not None:
                writer.start()
            app.state.ingest_writer = writer
            if run_scheduler:
                scheduler.start()
            yield
        finally:
            await scheduler.shutdown()
            await threshold_cache.aclose()
            if app.state.ingest_writer is not None:
                await app.state.ingest_writer.aclose()  # the batches queued so far are written
                app.state.ingest_writer = None
            await engines.dispose()

    app = FastAPI(
        title="hedgerow",
        version=__version__,
        description="Ingest of call records, measured hedge thresholds, threshold history.",
        lifespan=lifespan,
        default_response_class=ApiJSONResponse,
        docs_url=None,  # served from local files by install_docs (FastAPI's loads from a CDN)
        redoc_url=None,
    )
    app.add_middleware(
        BodyLimitMiddleware,
        limit_for=body_limit_for(settings),
        body_read_timeout_s=settings.body_read_timeout_s,
    )
    # before any body byte is read: forged Host/Origin, non-JSON writes, no token (hedgerow.api._request_guard)
    app.add_middleware(RequestGuardMiddleware, policy=host_policy)
    # outermost: a path with a control character never reaches routing (see hedgerow.api.path_check)
    app.add_middleware(ControlCharacterPathMiddleware)
    app.state.settings = settings
    app.state.tokens = tokens
    app.state.token_names = parse_token_names(settings.tokens)
    app.state.route_defaults = defaults
    app.state.route_ids = RouteIdCache()
    # days known to have partitions (PostgreSQL only; see hedgerow.api.calls)
    app.state.partition_days = DayPartitionCache(settings.retention_s)
    # SQLite: the group commit writer of POST /v1/calls, made by the lifespan (hedgerow.api.calls)
    app.state.ingest_writer = None
    app.state.metrics = metrics
    # calls_explorer before routes: /v1/routes/{route}/calls must not read as a route named .../calls
    for module in (calls, thresholds, calls_explorer, routes, controller, health, prices, reports, metrics_api):
        app.include_router(module.router)
    app.include_router(upstreams_api.router)
    install_docs(app)
    install_pages(app)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]

    for error in STORE_ERRORS:
        app.add_exception_handler(error, store_unavailable)

    @app.exception_handler(UnknownRoute)
    async def unknown_route(_request: Request, exc: UnknownRoute) -> JSONResponse:
        return error_response(status.HTTP_404_NOT_FOUND, "route", str(exc))

    @app.exception_handler(AmbiguousModel)
    async def ambiguous_model(_request: Request, exc: AmbiguousModel) -> JSONResponse:
        return unprocessable("model", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_error_detail(exc)}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    return app
