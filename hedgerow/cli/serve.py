"""``hedgerow serve``: the api and the controller job in one process (:mod:`hedgerow.api.server`),
and with ``--gateway FILE`` the gateway too (:mod:`hedgerow.gateway`: embedded mode)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import typer

from hedgerow.cli._common import _log_format_option, _log_level_option, _server_settings, app, fail

if TYPE_CHECKING:
    from hedgerow.settings import Settings


@app.command()
def serve(
    db: str = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Database URL (default HEDGEROW_DATABASE_URL, else sqlite+aiosqlite:///./hedgerow.db); migrated on start.",
    ),
    host: str = typer.Option(
        None,
        "--host",
        metavar="HOST",
        help="Interface to listen on (default 127.0.0.1; non-loopback needs HEDGEROW_TOKENS).",
    ),
    port: int = typer.Option(None, "--port", metavar="PORT", help="TCP port (default 8400; 0 picks a free one)."),
    interval: float = typer.Option(
        None, "--interval", metavar="S", help="Seconds between controller ticks (default 60)."
    ),
    log_level: str = _log_level_option(),
    log_format: str = _log_format_option(),
    access_log: bool = typer.Option(
        None, "--access-log/--no-access-log", help="Log one line per request (default HEDGEROW_ACCESS_LOG, else off)."
    ),
    gateway: str = typer.Option(
        None,
        "--gateway",
        metavar="FILE",
        help="Also serve the gateway of this TOML config (embedded: its records go to this api).",
    ),
    gateway_port: int = typer.Option(
        8480, "--gateway-port", metavar="P", help="With --gateway: its TCP port (default 8480; 0 picks a free one)."
    ),
) -> None:
    """Run the api and the controller job; prints one line once listening."""
    settings = _server_settings(
        db,
        host=host,
        port=port,
        controller_interval_s=interval,
        log_level=log_level,
        log_format=log_format,
        access_log=access_log,
    )
    # the app (FastAPI, SQLAlchemy, scipy) is imported once the flags are known to be good
    from hedgerow.api.errors import ApiConfigError
    from hedgerow.api.server import serve as serve_api
    from hedgerow.controller.errors import StoreError, StoreNotReady

    try:
        if gateway is None:
            serve_api(settings)
        else:
            from hedgerow.cli.gateway import _gateway_config

            config = _gateway_config(gateway, None, None, None, None, tokens=settings.tokens)
            asyncio.run(_serve_with_gateway(settings, config, gateway_port))
    except typer.Exit:
        raise  # printed already, with its own status (click's Exit is a RuntimeError)
    except StoreNotReady as exc:
        raise fail(str(exc), 1) from None
    except (ApiConfigError, StoreError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    except (OSError, RuntimeError) as exc:
        raise fail(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1) from None


def _ingest_token(settings: Settings) -> str | None:
    """A token of ``HEDGEROW_TOKENS`` with the ``ingest`` scope for the embedded gateway (None
    without tokens); exits 2 when tokens are set and none has that scope."""
    from hedgerow.api.auth import parse_tokens

    tokens = parse_tokens(settings.tokens) if settings.tokens else {}
    if not tokens:
        return None
    for token, scopes in tokens.items():
        if "ingest" in scopes:
            return token
    raise fail("--gateway: HEDGEROW_TOKENS has no token with the ingest scope for the gateway's records", 2)


async def _serve_with_gateway(settings: Settings, config: Any, gateway_port: int) -> None:
    """The api (:func:`hedgerow.api.server.serve_async`) and the gateway in one event loop.

    The gateway starts once the api listens and talks to it over loopback like any client: it
    polls the thresholds and sends its records with the api's ingest token. Its
    ``hedgerow_gateway_*`` family is served at the api's ``/metrics`` too. When either server
    stops (a signal reaches both: uvicorn hands it on as each one exits), the other is stopped.
    """
    from hedgerow.cli.gateway import listen_socket, require_keys_off_loopback

    token = _ingest_token(settings)
    # the gateway's refusals and its address first: a bad one starts no api and creates no store
    require_keys_off_loopback(config, settings.host)
    sock = listen_socket(settings.host, gateway_port)
    try:
        await _serve_both(settings, config, sock, token)
    finally:
        sock.close()


async def _serve_both(settings: Settings, config: Any, sock: Any, token: str | None) -> None:
    """:func:`_serve_with_gateway` once the gateway's socket (``sock``) is bound."""
    from hedgerow.api.server import listening_line, serve_async
    from hedgerow.cli.gateway import gateway_server
    from hedgerow.gateway import GatewayMetrics

    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def announce(url: str) -> None:
        print(listening_line(url, settings), flush=True)
        listening.set_result(url)

    stop = asyncio.Event()
    metrics = GatewayMetrics()
    api = asyncio.create_task(
        serve_async(settings, announce=announce, stop=stop, own_logging=True, collectors=[metrics])
    )
    pending: set[asyncio.Future[Any]] = {api, listening}
    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    if not listening.done():
        await api  # it failed to start: its error goes to the caller
        return
    try:
        server, sock = gateway_server(
            config,
            settings.host,
            sock.getsockname()[1],
            api=listening.result(),
            token=token,
            log_level=settings.log_level,
            metrics=metrics,
            sock=sock,
        )
    except BaseException:
        stop.set()
        await api
        raise
    gateway = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait({api, gateway}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        stop.set()
        await asyncio.wait({api, gateway})
    for task in (api, gateway):
        error = task.exception()
        if error is not None:
            raise error
