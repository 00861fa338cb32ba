"""``hedgerow db upgrade`` and ``hedgerow controller run-once`` (in-process, through typer)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select
from typer.testing import CliRunner

from hedgerow.cli import app
from hedgerow.cli.controller import LEASE_HELD_EXIT
from hedgerow.client.records import CallRecord
from hedgerow.controller.lease import CONTROLLER_LEASE, acquire_lease, lease_holder, release_lease
from hedgerow.controller.store.db import head_revision, make_engine, make_sessionmaker
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import ThresholdHistory
from hedgerow.settings import Settings
from tests.conftest import CallFactory


def _seed(url: str, records: list[CallRecord]) -> None:
    async def run() -> None:
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                await ingest_calls(session, records, defaults=route_defaults(Settings()))
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_db_upgrade_and_run_once(tmp_path: Path, call_factory: CallFactory) -> None:
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


def test_bad_url_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", "mysql://x/y"])
    assert result.exit_code == 2 and "is not supported" in result.output
    assert "Traceback" not in result.output


def _run_once_process(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``hedgerow controller run-once`` in a process of its own (its logging set up as in real use)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")}
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "controller", "run-once", "--db", url, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _lease(url: str, action: str, holder: str = "serve-host:4242:abcd1234") -> object:
    async def run() -> object:
        engine = make_engine(url)
        try:
            sessionmaker = make_sessionmaker(engine)
            if action == "take":
                return await acquire_lease(sessionmaker, CONTROLLER_LEASE, holder, 600.0)
            if action == "holder":
                return await lease_holder(sessionmaker, CONTROLLER_LEASE)
            return await release_lease(sessionmaker, CONTROLLER_LEASE, holder)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _history_rows(url: str) -> int:
    async def run() -> int:
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine)() as session:
                return int(await session.scalar(select(func.count()).select_from(ThresholdHistory)) or 0)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_run_once_refuses_while_serve_holds_the_lease_and_logs_what_it_publishes(
    tmp_path: Path, call_factory: CallFactory
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'lease.db'}"
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    _seed(url, [call_factory(f"c{i}") for i in range(5)])
    assert _lease(url, "take") is True  # what a running `serve` holds
    refused = _run_once_process(url, "--json")
    assert refused.returncode == LEASE_HELD_EXIT, refused.stderr
    assert "held by serve-host:4242:abcd1234 until" in refused.stderr and "nothing was ticked" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert _history_rows(url) == 0
    assert _lease(url, "holder")[0] == "serve-host:4242:abcd1234"  # type: ignore[index]

    assert _lease(url, "release") is True  # serve stopped
    ran = _run_once_process(url, "--json", "--log-format", "json")
    assert ran.returncode == 0, ran.stderr
    [row] = json.loads(ran.stdout)["history"]
    assert row["applied"] and row["hedge_after_s"] == 30.0
    events = [json.loads(line) for line in ran.stderr.splitlines() if line.startswith("{")]
    changed = [e for e in events if e.get("event") == "threshold_changed"]
    assert len(changed) == 1, ran.stderr
    assert (changed[0]["route"], changed[0]["to_s"], changed[0]["source"]) == ("summarize", 30.0, "cold_start")
    assert _lease(url, "holder") is None  # released at once: serve takes it on its next renewal
    assert _history_rows(url) == 1
