"""``serve(settings)``: run the api (and its controller job) under uvicorn until interrupted."""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from hedgerow.api._state import app_state
from hedgerow.api.app import create_app
from hedgerow.api.auth import check_listen_allowed, parse_tokens
from hedgerow.api.limits import header_timeout_protocol
from hedgerow.controller.store.db import make_engine, migrate_engine, safe_url
from hedgerow.logs import configure_logging, uvicorn_log_config
from hedgerow.settings import Settings

__all__ = [
    "GC_GEN0_THRESHOLD",
    "bind_socket",
    "event_loop_factory",
    "listening_line",
    "serve",
    "serve_async",
    "tune_gc",
]

#: Allocations between two young-generation collections of a ``serve`` process (CPython: 700).
GC_GEN0_THRESHOLD = 10_000


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) whose connections send without Nagle's delay.

    The socket is made with ``proto=IPPROTO_TCP`` (accepted sockets inherit it, and asyncio sets
    ``TCP_NODELAY`` on every accepted socket of that protocol; with ``proto=0`` it silently does
    not, and each response with a body on a kept-alive connection waits ~40 ms for the peer's
    delayed ACK) and ``TCP_NODELAY`` set on the listener as well.

    Args:
        host: address to bind (IPv6 with or without brackets).
        port: TCP port; 0 picks a free port.

    Raises:
        OSError: the address cannot be bound (in use, not local, ...).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def listening_line(url: str, settings: Settings) -> str:
    """The line ``hedgerow serve`` prints once it listens (tests and scripts read the address
    from it): ``hedgerow: api listening on URL (database URL with its password hidden)``."""
    return f"hedgerow: api listening on {url} (database {safe_url(settings.database_url)})"


async def serve_async(
    settings: Settings,
    *,
    announce: Any = None,
    stop: asyncio.Event | None = None,
    own_logging: bool = False,
    collectors: Sequence[Any] = (),
) -> None:
    """Serve until the process is interrupted (SIGINT/SIGTERM) or ``stop`` is set; shut down cleanly.

    The address is bound before the store is touched (a busy port creates no database); with
    ``own_logging`` logging follows ``settings.log_level``, ``log_format`` and ``access_log``.

    Args:
        settings: host, port, database, controller and logging settings.
        announce: called with the url once the server listens (default: print one line).
        stop: when given, setting this event stops the server (for embedding, e.g. the demo).
        own_logging: configure the process's logging from the settings (``hedgerow serve``);
            False leaves the host's logging alone and keeps uvicorn quiet (embedding).
        collectors: prometheus-client collectors also served at this api's ``/metrics`` (the
            embedded gateway's ``hedgerow_gateway_*`` family under ``serve --gateway``).

    Raises:
        ApiConfigError: no tokens on a non-loopback host, or malformed tokens.
        OSError: the address cannot be bound.
        StoreNotReady: the database cannot be reached or migrated.
        RuntimeError: the server failed to start.
    """
    check_listen_allowed(settings.host, parse_tokens(settings.tokens))
    if own_logging:
        configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    for collector in collectors:
        app_state(app).metrics.registry.register(collector)
    # bind first: a busy port fails before the database is created or migrated
    sock = bind_socket(settings.host, settings.port)
    engine = make_engine(settings.database_url)
    try:  # migrate before listening, so an unreachable database is one clear error
        await migrate_engine(engine, lock_timeout_s=settings.migration_lock_timeout_s)
    except BaseException:
        sock.close()
        raise
    finally:
        await engine.dispose()
    host, port = sock.getsockname()[:2]
    limits: dict[str, Any] = {
        "http": header_timeout_protocol(settings.header_read_timeout_s),
        "timeout_graceful_shutdown": math.ceil(settings.shutdown_timeout_s),
    }
    if own_logging:
        config = uvicorn.Config(
            app,
            log_level=settings.log_level,
            log_config=uvicorn_log_config(settings.log_level, settings.log_format, access_log=settings.access_log),
            lifespan="on",
            access_log=settings.access_log,
            **limits,
        )
    else:  # embedded (the demo): the host's logging, uvicorn quiet
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, **limits)
    server = _Server(config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    watcher = asyncio.create_task(_stop_when_set(stop, server)) if stop is not None else None
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{port}"
        if announce is None:
            print(listening_line(url, settings), flush=True)
        else:
            announce(url)
    try:
        await task
    except SystemExit as exc:  # uvicorn exits when the lifespan start-up fails
        raise RuntimeError(f"the api did not start (uvicorn exit status {exc.code})") from None
    finally:
        if watcher is not None:
            watcher.cancel()
        sock.close()
    if not server.started:
        raise RuntimeError("the api did not start (see the log above)")


class _Server(uvicorn.Server):
    """uvicorn's server, releasing the controller lease as soon as shutdown begins.

    uvicorn drains the requests in flight (up to ``timeout_graceful_shutdown``) before it runs
    the app's lifespan shutdown; the scheduler is stopped and its lease released first, so a
    replica that is draining never renews the lease and another takes over at once.
    """

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop the controller jobs and release the lease, then shut down as uvicorn does."""
        scheduler = getattr(app_state(self._app), "scheduler", None)
        if scheduler is not None:
            await scheduler.shutdown(timeout_s=0)
        await super().shutdown(sockets)


async def _stop_when_set(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    server.should_exit = True


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory where uvloop is installed (a dependency on CPython), else None.

    uvicorn's own ``loop="auto"`` only applies when uvicorn creates the loop; ``serve`` creates
    it, so it makes the same choice here.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on CPython/POSIX
        return None
    return uvloop.new_event_loop


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a server that allocates in bursts.

    A 1,000-record batch allocates a few hundred thousand objects (JSON, pydantic records, row
    tuples), nearly all freed by reference counting; with CPython's default threshold (700)
    that runs hundreds of young collections per batch and, every hundred of them, a full one
    over everything the process ever imported. Measured in-process on PostgreSQL (20k records,
    2-core machine under load): about 100 us of CPU per record with the defaults, 82 us with
    the collector off. So the objects alive at start (modules, the app) are moved out of the
    collector's sight (:func:`gc.freeze`) and the young generation is collected every
    :data:`GC_GEN0_THRESHOLD` allocations: cycles are still collected, a little later.
    """
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def serve(settings: Settings) -> None:
    """Run :func:`serve_async` (with its own logging) until interrupted (blocking).

    The event loop is uvloop's where installed (:func:`event_loop_factory`), the HTTP parser
    httptools' (:func:`~hedgerow.api.limits.header_timeout_protocol`); the garbage collector is
    tuned for bursts of allocations (:func:`tune_gc`).
    """
    tune_gc()
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve_async(settings, own_logging=True))
    except KeyboardInterrupt:  # pragma: no cover - uvicorn handles the signal itself
        sys.exit(130)
