"""``hedgerow gateway``: the hedging race as an OpenAI-compatible server (:mod:`hedgerow.gateway`).

Configured by a FILE or by ``--upstream`` flags; runs under uvicorn until SIGINT or SIGTERM.
"""

from __future__ import annotations

from typing import Any

import typer

from hedgerow.cli._common import _check_name, _parse_number, _parse_upstream, _server_settings, app, fail

#: How long (s) the gateway keeps an idle caller connection open. Longer than the idle timeouts
#: of common load balancers (60 s) and clients (httpx: 5 s), so that the caller, not the gateway,
#: ends an idle connection: a request sent just as the server closes its end fails (ReadError), and
#: with uvicorn's default of 5 s, equal to httpx's, a gateway short of CPU at that moment did so.
KEEP_ALIVE_S = 75


def _token_keys(tokens: str) -> dict[str, str]:
    """The tokens of ``HEDGEROW_TOKENS`` (``tokens``) with the ``gateway`` scope, as gateway keys:
    ``{token: name}``, the name being the entry's ``name=``, else the token's fingerprint
    (``token:<12 hex digits>``, :func:`hedgerow.api.auth.token_actor`). Exits 2 for malformed
    tokens, or a gateway token shorter than 16 characters (named by its position, not its value).
    """
    if not tokens.strip():
        return {}
    from hedgerow.api.auth import parse_token_names, parse_tokens, token_actor
    from hedgerow.api.errors import ApiConfigError
    from hedgerow.gateway._config import MIN_KEY_CHARS

    try:
        scopes = parse_tokens(tokens)
        names = parse_token_names(tokens)
    except ApiConfigError as exc:
        raise fail(str(exc), 2) from None
    keys: dict[str, str] = {}
    for position, (token, token_scopes) in enumerate(scopes.items(), start=1):
        if "gateway" not in token_scopes:
            continue
        if len(token) < MIN_KEY_CHARS:
            raise fail(
                f"HEDGEROW_TOKENS: token {position} has the gateway scope and {len(token)} characters, "
                f"fewer than {MIN_KEY_CHARS}",
                2,
            )
        keys[token] = names.get(token) or token_actor(scopes, names, token)
    return keys


def _gateway_config(
    file: str | None,
    upstream: list[str] | None,
    model: str | None,
    hedge_after: str | None,
    budget: str | None,
    *,
    total_timeout: str | None = None,
    max_concurrent_per_key: int | None = None,
    tokens: str = "",
) -> Any:
    """The ``GatewayConfig`` of ``hedgerow gateway`` from FILE or ``--upstream``; exits 2 naming the problem.

    ``--hedge-after``, ``--budget`` and ``--total-timeout`` set every route's policy (over the
    file's values), ``--max-concurrent-per-key`` the file's ``max_concurrent_per_key``; the
    tokens of ``HEDGEROW_TOKENS`` (``tokens``) with the ``gateway`` scope are keys too
    (:func:`_token_keys`).
    """
    import os
    from dataclasses import replace

    from hedgerow.gateway import ConfigError, GatewayConfig, RouteSpec, load_config
    from hedgerow.gateway._config import build_policy, keys_from_env

    if (file is None) == (not upstream):
        raise fail("give a config FILE or --upstream NAME=URL (not both)", 2)
    if max_concurrent_per_key is not None and max_concurrent_per_key < 1:
        raise fail(f"--max-concurrent-per-key: must be 1 or more, got {max_concurrent_per_key}", 2)
    token_keys = _token_keys(tokens)
    overrides: dict[str, Any] = {}
    if hedge_after is not None:
        overrides["hedge_after_s"] = _parse_number("--hedge-after", hedge_after, "a number of seconds >= 0")
    if total_timeout is not None:
        overrides["total_timeout_s"] = _parse_number("--total-timeout", total_timeout, "a number of seconds > 0")
    if budget is not None:
        from hedgerow.controller.ops_bounds import parse_budget

        try:
            overrides["budget"] = parse_budget(budget)
        except ValueError as exc:
            raise fail(f"--budget: must be a fraction in [0, 1] or a percent (0.05 or 5%): {exc}", 2) from None
    try:
        if file is not None:
            if model is not None:
                raise fail("--model: only with --upstream (the FILE names its models)", 2)
            config = load_config(file)
            routes = {
                name: RouteSpec(
                    spec.public_model, spec.route, spec.upstreams, build_policy(name, overrides, spec.policy)
                )
                for name, spec in config.routes.items()
            }
            per_key = config.max_concurrent_per_key if max_concurrent_per_key is None else max_concurrent_per_key
            return replace(config, routes=routes, keys={**config.keys, **token_keys}, max_concurrent_per_key=per_key)
        upstreams = [_parse_upstream(u) for u in upstream or []]
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise fail(f"--upstream: names must be unique, got {', '.join(names)}", 2)
        if model is not None:
            _check_name("--model", model)
        policy = build_policy("policy", {"hedge_after_s": 2.0, **overrides})
        spec = RouteSpec(model, "default", tuple(upstreams), policy)
        keys = {**keys_from_env(os.environ), **token_keys}
        routes = {} if model is None else {model: spec}
        return GatewayConfig(
            routes=routes,
            any_model=spec if model is None else None,
            keys=keys,
            max_concurrent_per_key=max_concurrent_per_key,
            source="--upstream",
        )
    except ConfigError as exc:
        message = str(exc)
        for field, flag in (
            ("hedge_after_s", "--hedge-after"),
            ("budget", "--budget"),
            ("total_timeout_s", "--total-timeout"),
        ):
            if field in overrides and f".{field}:" in message:
                message = f"{flag}:{message.split(f'.{field}:', 1)[1]}"
        raise fail(message, 2) from None


@app.command(
    epilog="Exit status: 130 after SIGINT (Ctrl-C) and 143 after SIGTERM, once shut down cleanly (uvicorn "
    "re-raises the signal); 1 when it cannot listen or the --db store cannot be migrated; 2 for bad flags or config."
)
def gateway(
    file: str = typer.Argument(None, metavar="[FILE]", help="The gateway's TOML config (models, upstreams, keys)."),
    upstream: list[str] = typer.Option(
        None,
        "--upstream",
        metavar="NAME=URL",
        help="Without FILE: NAME=BASE_URL (ends in /v1); repeat; first = primary.",
    ),
    model: str = typer.Option(
        None, "--model", metavar="M", help="With --upstream: the one public model name (default: any model passes)."
    ),
    hedge_after: str = typer.Option(
        None, "--hedge-after", metavar="S", help="Seconds without a first token before hedging (default 2, or FILE's)."
    ),
    budget: str = typer.Option(
        None, "--budget", metavar="F", help="Hedge budget, a fraction or a percent (default 0.10, or FILE's)."
    ),
    total_timeout: str = typer.Option(
        None,
        "--total-timeout",
        metavar="S",
        help="Seconds a call may take in all; past it, 504 (default 120, or FILE's total_timeout_s).",
    ),
    max_concurrent_per_key: int = typer.Option(
        None,
        "--max-concurrent-per-key",
        metavar="N",
        help="Requests in flight at once per key name; past it, 429 (default FILE's, else no bound).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="H", help="Interface to listen on; off loopback, gateway keys are required."
    ),
    port: int = typer.Option(8480, "--port", metavar="P", help="TCP port (default 8480; 0 picks a free one)."),
    api: str = typer.Option(
        None, "--api", metavar="URL", help="A running `hedgerow serve`: poll its thresholds, send it the records."
    ),
    db: str = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Instead of --api: write the records into this store and read its thresholds (migrated on start).",
    ),
    token: str = typer.Option(
        None,
        "--token",
        metavar="T",
        envvar="HEDGEROW_TOKEN",
        show_default=False,
        help="Bearer token for --api (HEDGEROW_TOKEN).",
    ),
    log_level: str = typer.Option("info", "--log-level", metavar="LEVEL", help="debug, info, warning or error."),
) -> None:
    """Serve the hedging race as an OpenAI-compatible endpoint: point any OpenAI client's base URL here.

    Gateway keys (callers send Authorization: Bearer KEY) come from FILE's `keys`, from
    HEDGEROW_GATEWAY_KEYS (NAME=KEY,NAME=KEY) and from the HEDGEROW_TOKENS tokens with the
    `gateway` scope; a key's name names its caller in the records and the metrics. Upstream keys
    come from the environment variables FILE names. Without --api or --db, the calls' records are
    only counted and logged.
    """
    if api is not None and db is not None:
        raise fail("--db and --api: give one (records straight into a store, or to a running serve)", 2)
    config = _gateway_config(
        file,
        upstream,
        model,
        hedge_after,
        budget,
        total_timeout=total_timeout,
        max_concurrent_per_key=max_concurrent_per_key,
        tokens=_tokens_setting(),
    )
    from hedgerow.logs import configure_logging

    try:
        configure_logging(log_level)
    except ValueError as exc:
        raise fail(f"--log-level: {exc}", 2) from None
    server, sock = gateway_server(config, host, port, api=api, token=token, log_level=log_level, db=db)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _gateway_store(db: str) -> Any:
    """The ``GatewayStore`` of ``--db URL``, the store migrated to the newest revision first.

    Exits 2 for a malformed or unsupported URL (naming ``--db``), 1 when the store cannot be
    reached or migrated.
    """
    import asyncio

    from hedgerow.cli.gateway_store import GatewayStore, migrate_store
    from hedgerow.controller.errors import StoreError

    settings = _server_settings(db)
    try:
        asyncio.run(migrate_store(settings))
    except StoreError as exc:
        raise fail(f"--db: {exc}", 1) from None
    return GatewayStore(settings)


def _tokens_setting() -> str:
    """``HEDGEROW_TOKENS`` as the settings read it; a bad environment exits 2 naming the variable."""
    from pydantic import ValidationError

    from hedgerow.settings import Settings

    try:
        return Settings().tokens
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        raise fail(f"HEDGEROW_{field.upper()}: {error['msg'].removeprefix('Value error, ')}", 2) from None


def require_keys_off_loopback(config: Any, host: str) -> None:
    """Refuse to serve ``config`` off loopback without gateway keys.

    Raises:
        typer.Exit: exit 2 (the reason printed) when ``host`` is not a loopback address and
            ``config`` holds no keys.
    """
    from hedgerow.gateway import is_loopback

    if not is_loopback(host) and not config.keys:
        raise fail(
            f"--host {host}: off loopback the gateway needs keys (set HEDGEROW_GATEWAY_KEYS=NAME=KEY, "
            "`keys` in the file, or a HEDGEROW_TOKENS token with the gateway scope)",
            2,
        )


def listen_socket(host: str, port: int) -> Any:
    """A TCP socket bound to ``host``:``port`` and listening (port 0 picks a free one).

    Raises:
        typer.Exit: exit 1 (``cannot listen on HOST:PORT: why`` printed) when it cannot be bound.
    """
    import socket

    try:
        return socket.create_server((host, port))
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1) from None


def gateway_server(
    config: Any,
    host: str,
    port: int,
    *,
    api: str | None,
    token: str | None,
    log_level: str,
    metrics: Any = None,
    db: str | None = None,
    sock: Any = None,
) -> tuple[Any, Any]:
    """The gateway's uvicorn server and its bound socket (``hedgerow gateway``, ``serve --gateway``).

    Prints the line ``hedgerow gateway: listening on http://HOST:PORT/v1 (...)`` once bound.

    Args:
        config: the ``GatewayConfig``.
        host / port: where to listen (port 0 picks a free one); off loopback ``config`` must
            hold gateway keys.
        api: a ``hedgerow serve`` to poll thresholds from and send records to, or None (records
            are only counted and logged).
        token: the bearer token for ``api``.
        log_level: uvicorn's log level.
        metrics: the ``GatewayMetrics`` the app counts into (default: its own).
        db: a store's URL (``--db``) to write the records into and read the thresholds from,
            instead of ``api``; migrated here, before the address is bound.
        sock: a socket bound already (:func:`listen_socket`) to serve on instead of binding
            ``host``/``port`` here.

    Returns:
        ``(uvicorn.Server, socket.socket)``: run the server on the socket, close it after.

    Raises:
        typer.Exit: exit 2 for keys missing off loopback, a bad ``api`` or ``db``; exit 1 when
            the store cannot be migrated or the address cannot be bound.
    """
    import uvicorn

    from hedgerow.gateway import GatewayApp
    from hedgerow.logs import uvicorn_log_config

    require_keys_off_loopback(config, host)
    background: list[Any] = []
    poller = exporter = None
    if db is not None:
        store = _gateway_store(db)
        poller = exporter = store
        background = [store]
    elif api is not None:
        from hedgerow.client import TelemetryExporter, ThresholdPoller

        try:
            poller = ThresholdPoller(api, token=token)
            exporter = TelemetryExporter(api, token=token)
        except ValueError as exc:
            raise fail(f"--api: {exc}", 2) from None
        background = [poller, exporter]
    gateway_app = GatewayApp(config, thresholds=poller, telemetry=exporter, background=background, metrics=metrics)
    if sock is None:
        sock = listen_socket(host, port)
    bound = sock.getsockname()
    count = len(config.routes)
    served = "any model" if config.any_model is not None else f"{count} model{'' if count == 1 else 's'}"
    typer.echo(f"hedgerow gateway: listening on http://{host}:{bound[1]}/v1 ({served})")
    server = uvicorn.Server(
        uvicorn.Config(
            gateway_app,
            log_config=uvicorn_log_config(log_level),
            lifespan="on",
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=10,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    )
    return server, sock
