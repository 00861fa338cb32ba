"""What every ``hedgerow`` command shares: the Typer ``app``, ``fail`` and the flag parsers.

The command modules of this package register their commands on ``app``. Everything here is
cheap to import: what a parser needs (the client, pydantic, SQLAlchemy) is imported inside it,
so that ``hedgerow --help`` loads no web framework, ORM or numeric library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hedgerow import __version__

if TYPE_CHECKING:
    from hedgerow.client import Upstream
    from hedgerow.settings import Settings

app = typer.Typer(
    name="hedgerow",
    help="First-token hedged requests for LLM APIs, with thresholds set by measurement.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without type metavars, nothing truncated
    context_settings={"max_content_width": 120, "terminal_width": 120},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hedgerow {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """First-token hedged requests for LLM APIs, with thresholds set by measurement."""


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as one line on stderr and return the Exit to raise (status ``code``)."""
    typer.echo(f"hedgerow: {message}", err=True)
    return typer.Exit(code)


# ---- record names, upstreams and numbers (call, gateway) ----


def _name_problem(value: str, *, route: bool = False) -> str | None:
    """Why ``value`` cannot be a name in a call record (route, model, upstream), or None if it can.

    The rule of route and model names (:mod:`hedgerow.client.names`: 1 to 200 characters, no
    control or format characters, not blank, no whitespace at either end; with ``route`` also not
    ending in ``/history``), which the api applies to the records.
    """
    from hedgerow.client.names import name_error, route_name_error

    return route_name_error(value) if route else name_error(value)


def _check_name(flag: str, value: str, *, route: bool = False) -> str:
    """Return ``value`` if it can be a record name; else exit 2 with one line naming ``flag``."""
    problem = _name_problem(value, route=route)
    if problem is not None:
        raise fail(f"{flag}: {problem}", 2)
    return value


def _parse_upstream(text: str) -> Upstream:
    """``NAME=BASE_URL`` -> ``Upstream``; a bad value exits 2 with one line naming ``--upstream``."""
    from hedgerow.client import Upstream

    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise fail(f"--upstream: expected NAME=BASE_URL, got {text!r}", 2)
    try:
        upstream = Upstream(name, url)
    except ValueError as exc:
        raise fail(f"--upstream: {exc}", 2) from None
    problem = _name_problem(name)
    if problem is not None:
        raise fail(f"--upstream: NAME {problem}", 2)
    return upstream


def _parse_number(flag: str, text: str | None, what: str) -> float | None:
    """Parse a numeric flag given as text (None stays None); not a number exits 2 naming ``flag``.

    The flags are read as text so that a typo gives one line (``--budget: not a number: 'x'``)
    instead of click's multi-line usage error. Ranges are checked by ``HedgePolicy``.
    """
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise fail(f"{flag}: must be {what}, got {text!r}", 2) from None
    return value


# ---- settings and logging flags of the commands that open the store (serve, db, controller, report) ----


#: The flag of each setting that a command takes as a flag (errors name what the user typed).
_SETTING_FLAGS = {
    "database_url": "--db",
    "host": "--host",
    "port": "--port",
    "controller_interval_s": "--interval",
    "retention_s": "--retention",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "access_log": "--access-log",
}


def _server_settings(db: str | None, **overrides: Any) -> Settings:
    """Settings from the environment with the command's flags on top.

    A bad value exits 2 with one line naming what the user typed: the flag (``--log-format``)
    when it came from a flag, else the environment variable (``HEDGEROW_LOG_FORMAT``); a
    malformed or unsupported ``--db`` exits 2 in every command.
    """
    from pydantic import ValidationError

    from hedgerow.controller.errors import StoreError
    from hedgerow.controller.store.db import check_database_url
    from hedgerow.settings import Settings

    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if db is not None:
        values["database_url"] = db
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        name = _SETTING_FLAGS.get(field, field) if field in values else f"HEDGEROW_{field.upper()}"
        raise fail(f"{name}: {error['msg'].removeprefix('Value error, ')}", 2) from None
    try:
        check_database_url(settings.database_url)
    except StoreError as exc:
        name = "--db" if db is not None else "HEDGEROW_DATABASE_URL"
        raise fail(f"{name}: {exc}", 2) from None
    return settings


def _require_existing_sqlite_file(url: str) -> None:
    """Exit 1 when ``url`` names a SQLite file that does not exist (instead of creating it empty)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return  # the store reports a malformed URL itself
    database = parsed.database
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" and not Path(database).exists():
        raise fail(
            f"no database file at {database}: run `hedgerow db upgrade` (with --db) or `hedgerow serve` first", 1
        )


def _log_level_option(note: str = "") -> Any:
    """The ``--log-level`` option of the commands that log (``serve``, ``controller run-once``);
    ``note`` is added to its help."""
    return typer.Option(
        None,
        "--log-level",
        metavar="LEVEL",
        help=f"debug, info, warning, error or critical (default HEDGEROW_LOG_LEVEL, else info){note}.",
    )


def _log_format_option() -> Any:
    """The ``--log-format`` option of the commands that log."""
    return typer.Option(
        None,
        "--log-format",
        metavar="FORMAT",
        help="text or json: one JSON object per line (default HEDGEROW_LOG_FORMAT, else text).",
    )
