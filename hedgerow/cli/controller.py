"""``hedgerow controller``: ``run-once``, one controller tick now, its decisions printed."""

from __future__ import annotations

import typer

from hedgerow.cli._common import (
    _log_format_option,
    _log_level_option,
    _require_existing_sqlite_file,
    _server_settings,
    app,
    fail,
)

controller_app = typer.Typer(help="The threshold controller.", no_args_is_help=True, rich_markup_mode=None)

app.add_typer(controller_app, name="controller")

#: Exit code of ``controller run-once`` while another process holds the controller lease
#: (``EX_TEMPFAIL`` of sysexits.h: nothing was done, try again later).
LEASE_HELD_EXIT = 75


@controller_app.command("run-once")
def controller_run_once(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decisions as JSON instead of a table."),
    log_level: str = _log_level_option("; logs go to stderr"),
    log_format: str = _log_format_option(),
) -> None:
    """Run one controller tick now and print its decisions (one history row per route).

    The tick takes the controller lease first: while a running `serve` holds it nothing is ticked
    and the command exits 75 naming the holder. Applied changes are logged to stderr
    (`threshold_changed` lines), as the scheduled tick's are.
    """
    import asyncio
    import json

    from rich.console import Console
    from rich.table import Table

    from hedgerow.cli._ops_api import plain_cell
    from hedgerow.client.names import visible
    from hedgerow.controller.errors import LeaseHeld, StoreError
    from hedgerow.logs import configure_logging

    settings = _server_settings(db, log_level=log_level, log_format=log_format)
    _require_existing_sqlite_file(settings.database_url)
    configure_logging(settings.log_level, settings.log_format)
    # scipy: once the flags are known to be good
    from hedgerow.controller.jobs import run_once

    try:
        rows = asyncio.run(run_once(settings))
    except LeaseHeld as exc:
        raise fail(str(exc), LEASE_HELD_EXIT) from None
    except StoreError as exc:
        raise fail(str(exc), 1) from None
    if as_json:
        typer.echo(json.dumps({"history": rows}, indent=2))
        return

    def seconds(value: object) -> str:
        return "-" if value is None else f"{value:.3f}"

    def fraction(value: object) -> str:
        return "-" if value is None else f"{value:.1%}"

    table = Table(title=f"controller tick: {len(rows)} route(s)")
    for column in (
        "route",
        "model",
        "previous_s",
        "hedge_after_s",
        "applied",
        "reason",
        "source",
        "samples",
        "censored",
        "p50_s",
        "p90_s",
        "p99_s",
        "hedge rate",
        "backup wins",
        "budget",
    ):
        table.add_column(column, justify="right" if column not in ("route", "model", "reason", "source") else "left")
    for row in rows:
        table.add_row(  # names as plain text: no rich markup, control characters escaped
            plain_cell(visible(row["route"])),
            plain_cell(visible(row["model"])),
            seconds(row["previous_hedge_after_s"]),
            seconds(row["hedge_after_s"]),
            "yes" if row["applied"] else "held",
            row["reason"],
            row["source"],
            str(row["samples"]),
            str(row["censored"]),
            seconds(row["p50_s"]),
            seconds(row["p90_s"]),
            seconds(row["p99_s"]),
            fraction(row["observed_hedge_rate"]),
            fraction(row["backup_win_rate"]),
            fraction(row["budget"]),
        )
    Console(width=200).print(table)
