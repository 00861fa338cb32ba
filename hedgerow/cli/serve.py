"""``hedgerow serve``: the api and the controller job in one process (:mod:`hedgerow.api.server`)."""

from __future__ import annotations

import typer

from hedgerow.cli._common import _log_format_option, _log_level_option, _server_settings, app, fail


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
        serve_api(settings)
    except StoreNotReady as exc:
        raise fail(str(exc), 1) from None
    except (ApiConfigError, StoreError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    except (OSError, RuntimeError) as exc:
        raise fail(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1) from None
