"""``hedgerow db``: the SQL store's ``upgrade`` (migrations) and ``retention`` (rollups, then deletion)."""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from hedgerow.cli._common import _require_existing_sqlite_file, _server_settings, app, fail

db_app = typer.Typer(help="The SQL store.", no_args_is_help=True, rich_markup_mode=None)

app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    revision: str = typer.Option("head", "--revision", metavar="REV", help="Target revision."),
) -> None:
    """Migrate the store to the newest schema (or to --revision).

    Safe to run while another `db upgrade` or a starting `serve` migrates the same store: it
    waits for the store's migration lock (HEDGEROW_MIGRATION_LOCK_TIMEOUT_S, 600 s) and then
    finds the store migrated. A failed migration is rolled back whole (exit 1).
    """
    from hedgerow.controller.errors import StoreError, StoreNotReady
    from hedgerow.controller.store.db import known_revisions, upgrade_database

    settings = _server_settings(db)
    try:
        upgrade_database(settings.database_url, revision, lock_timeout_s=settings.migration_lock_timeout_s)
    except StoreNotReady as exc:
        raise fail(str(exc), 1) from None
    except StoreError as exc:
        raise fail(str(exc), 2) from None
    current = asyncio.run(_revision_of(settings.database_url))
    if revision not in ("head", current) and revision in known_revisions():
        # alembic's upgrade does nothing for a target behind the store's revision
        typer.echo(
            f"hedgerow: database is at revision {current}, past {revision}: nothing done (upgrade never goes back)"
        )
        return
    typer.echo(f"hedgerow: database migrated to revision {current}")


async def _revision_of(url: str) -> str | None:
    """The revision the store at ``url`` is at (one connection, closed)."""
    from hedgerow.controller.store.db import current_revision, make_engine

    engine = make_engine(url)
    try:
        return await current_revision(engine)
    finally:
        await engine.dispose()


@db_app.command("retention")
def db_retention(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    retention: float = typer.Option(
        None,
        "--retention",
        metavar="S",
        help="Delete raw calls older than this many seconds (default HEDGEROW_RETENTION_S, 14 days).",
    ),
    fold_only: bool = typer.Option(False, "--fold-only", help="Fold hourly rollups but delete nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print what was folded and deleted as JSON."),
) -> None:
    """Fold raw calls into hourly rollups, then delete raw calls older than the retention age."""
    import asyncio
    import json

    from hedgerow.controller.errors import StoreError
    from hedgerow.controller.store.retention import run_retention_once

    settings = _server_settings(db, retention_s=retention)
    _require_existing_sqlite_file(settings.database_url)
    try:
        report = asyncio.run(run_retention_once(settings, delete_raw=not fold_only))
    except StoreError as exc:
        raise fail(str(exc), 1) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    typer.echo(retention_line(report.to_dict(), fold_only=fold_only))


def retention_line(summary: dict[str, Any], *, fold_only: bool) -> str:
    """The one line ``db retention`` prints for a run's ``RetentionReport.to_dict()`` summary.

    Args:
        summary: ``folded_hours``, ``deleted_calls``, ``deleted_attempts``, ``cutoff``,
            ``skipped_hours`` and ``dropped_days`` (ISO dates; PostgreSQL only) of the run.
        fold_only: the run deleted nothing (``--fold-only``).
    """
    if fold_only:
        return f"hedgerow: folded {summary['folded_hours']} hour(s); deleted nothing (--fold-only)"
    return (
        f"hedgerow: folded {summary['folded_hours']} hour(s); deleted {summary['deleted_calls']} "
        f"call(s) and {summary['deleted_attempts']} attempt(s) started before {summary['cutoff']}"
        + (f"; kept {summary['skipped_hours']} hour(s) not yet rolled up" if summary["skipped_hours"] else "")
        + (f"; dropped the partitions of {', '.join(summary['dropped_days'])}" if summary["dropped_days"] else "")
    )
