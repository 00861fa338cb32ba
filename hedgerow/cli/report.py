"""``hedgerow report weekly``: the weekly cost/latency report of a store, in any format.

Registered on the ``hedgerow`` app (:mod:`hedgerow.cli`) as the ``report`` sub-command. The figures are those of
``GET /v1/reports/weekly`` and of the scheduled job (all call
:func:`hedgerow.controller.report.report_store.weekly_report`); the store is only read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hedgerow.cli._common import _require_existing_sqlite_file, _server_settings, app, fail

__all__ = ["report_app"]

report_app = typer.Typer(
    help="Reports of what hedging cost and what it bought.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(report_app, name="report")


@report_app.command("weekly")
def weekly(
    week: str = typer.Option(
        None, "--week", metavar="WEEK", help="ISO week, e.g. 2026-W48 (default: the current week, partial)."
    ),
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    fmt: str = typer.Option("json", "--format", metavar="FORMAT", help="json, csv, html or md."),
    output: Path = typer.Option(None, "-o", "--output", metavar="FILE", help="Write to this file instead of stdout."),
) -> None:
    """Print (or write with -o) the weekly report of an ISO week (UTC), per route and model and in total.

    Exit status: 0 written, 1 the store cannot be read, 2 a bad option (such as a week that has
    not started). A week without calls is written with null figures and a note on stderr.
    """
    import asyncio
    from datetime import UTC, datetime

    from hedgerow.controller.errors import StoreError
    from hedgerow.controller.ops_bounds import unstarted_week_message
    from hedgerow.controller.report.report import IsoWeek
    from hedgerow.controller.report.report_render import FORMATS, render
    from hedgerow.controller.report.report_store import weekly_report
    from hedgerow.controller.store.db import check_ready, make_engine, make_sessionmaker

    if fmt not in FORMATS:
        raise fail(f"--format: must be one of {', '.join(FORMATS)}, got {fmt!r}", 2)
    try:
        parsed = None if week is None else IsoWeek.parse(week)
    except ValueError as exc:
        raise fail(f"--week: {exc}", 2) from None
    unstarted = None if parsed is None else unstarted_week_message(parsed, IsoWeek.of(datetime.now(UTC)))
    if unstarted is not None:
        raise fail(f"--week: {unstarted}", 2)
    settings = _server_settings(db)
    _require_existing_sqlite_file(settings.database_url)

    async def build() -> dict[str, Any]:
        engine = make_engine(settings.database_url)
        try:
            await check_ready(engine)  # an empty or old store: "run `hedgerow db upgrade`", as the other commands say
            return await weekly_report(make_sessionmaker(engine), parsed)
        finally:
            await engine.dispose()

    try:
        report = asyncio.run(build())
    except StoreError as exc:
        raise fail(str(exc), 1) from None
    except Exception as exc:  # a store that is not migrated, unreachable, ...
        raise fail(f"cannot read the store: {type(exc).__name__}: {str(exc).splitlines()[0]}", 1) from None
    if report["total"]["calls"] == 0:  # said on stderr too, so a script's JSON of nulls is not read as figures
        typer.echo(f"hedgerow: no calls in {report['week']}: the report has no latency, hedge rate or spend", err=True)
    text = render(report, fmt)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise fail(f"-o: cannot write {output}: {exc}", 1) from None
    typer.echo(f"hedgerow: wrote the {fmt} report of {report['week']} to {output}", err=True)
