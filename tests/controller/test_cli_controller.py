"""``hedgerow db upgrade`` and ``hedgerow controller run-once`` (in-process, through typer)."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from hedgerow.cli import app
from hedgerow.controller.db import head_revision, make_engine, make_sessionmaker
from hedgerow.controller.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings


def _seed(url: str, records) -> None:
    async def run() -> None:
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                await ingest_calls(session, records, defaults=route_defaults(Settings()))
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_db_upgrade_and_run_once(tmp_path, call_factory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    not_ready = runner.invoke(app, ["controller", "run-once", "--db", url])
    assert not_ready.exit_code == 1 and "run `hedgerow db upgrade`" in not_ready.output
    assert not (tmp_path / "cli.db").exists()  # a missing store is reported, not created empty
    upgraded = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert upgraded.exit_code == 0 and f"revision {head_revision()}" in upgraded.output
    behind = runner.invoke(app, ["db", "upgrade", "--db", url, "--revision", "0005"])  # upgrade never goes back
    assert behind.exit_code == 0, behind.output
    assert f"at revision {head_revision()}, past 0005: nothing done" in behind.output
    _seed(url, [call_factory(f"c{i}") for i in range(5)])
    as_json = runner.invoke(app, ["controller", "run-once", "--db", url, "--json"])
    assert as_json.exit_code == 0, as_json.output
    [row] = json.loads(as_json.stdout)["history"]
    # a cold route: 5 samples support no value below the maximum within the budget
    assert (row["route"], row["samples"], row["hedge_after_s"]) == ("summarize", 5, 30.0)
    table = runner.invoke(app, ["controller", "run-once", "--db", url])
    assert table.exit_code == 0 and "summarize" in table.output and "cold_start_supported" in table.output


def test_bad_url_is_one_line(tmp_path) -> None:
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", "mysql://x/y"])
    assert result.exit_code == 2 and "is not supported" in result.output
    assert "Traceback" not in result.output
