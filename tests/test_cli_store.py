"""The store's lifecycle through the CLI, in real processes: concurrent ``db upgrade`` runs on one
store, the migration lock's bounded wait, and database URLs in error messages."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hedgerow.controller.store.db import head_revision, upgrade_database
from tests.conftest import PG_ENV, create_pg_database, drop_pg_database
from tests.helpers import store_revision

#: Pairs of concurrent ``db upgrade`` runs per store kind (each on a fresh store). Before the
#: migrations were serialised about one SQLite pair in ten was left half-migrated.
PAIRS = 12


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")} | extra


def _cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        cwd=cwd,
        timeout=180,
        check=False,
    )


def _upgrade_pair(url: str, cwd: Path) -> list[tuple[int, str]]:
    """Start two ``hedgerow db upgrade --db url`` processes together; their (exit code, stderr)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "hedgerow.cli", "db", "upgrade", "--db", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=cwd,
        )
        for _ in range(2)
    ]
    out = []
    for process in processes:
        _, stderr = process.communicate(timeout=240)
        out.append((process.returncode, stderr))
    return out


def _assert_usable_at_head(url: str) -> None:
    """The store is at head, answers, and a further upgrade is a no-op that succeeds."""
    upgrade_database(url)  # a half-migrated store fails here (e.g. duplicate column name)
    assert asyncio.run(store_revision(url)) == head_revision()


def test_concurrent_upgrades_of_a_fresh_sqlite_file_all_succeed(tmp_path: Path) -> None:
    failures = []
    for pair in range(PAIRS):
        url = f"sqlite+aiosqlite:///{tmp_path / f'pair{pair}.db'}"
        results = _upgrade_pair(url, tmp_path)
        failures += [(pair, code, err[-400:]) for code, err in results if code != 0]
        _assert_usable_at_head(url)
    assert failures == []


def test_concurrent_upgrades_of_a_fresh_postgresql_database_all_succeed(tmp_path: Path) -> None:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set")
    failures = []
    for pair in range(PAIRS // 2):
        url = asyncio.run(create_pg_database(base, "hedgerow_up"))
        try:
            results = _upgrade_pair(url, tmp_path)
            failures += [(pair, code, err[-400:]) for code, err in results if code != 0]
            _assert_usable_at_head(url)
        finally:
            asyncio.run(drop_pg_database(url))
    assert failures == []


def test_an_upgrade_waits_a_bounded_time_for_the_sqlite_lock_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    url = f"sqlite+aiosqlite:///{path}"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode=WAL")
        holder.execute("BEGIN EXCLUSIVE")  # another migration (or writer) holds the store
        started = time.monotonic()
        result = _cli("db", "upgrade", "--db", url, cwd=tmp_path, HEDGEROW_MIGRATION_LOCK_TIMEOUT_S="1")
        waited_s = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert result.returncode == 1, result.stderr
    assert str(path) in result.stderr and "lock" in result.stderr and "Traceback" not in result.stderr
    assert waited_s < 120  # bounded (the process start dominates; the wait itself is 1 s)
    assert _cli("db", "upgrade", "--db", url, cwd=tmp_path).returncode == 0  # free again: it migrates


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+asyncpg://admin:Hunter2Secret@db.example:notaport/hedgerow",  # a bad port
        "postgresql+asyncpg//admin:Hunter2Secret@db.example/hedgerow",  # no "://"
        "mysql://admin:Hunter2Secret@db.example/hedgerow",  # parses, unsupported driver
        "postgresql+asyncpg://admin:Hunter2Secret@[::1/hedgerow",  # an unclosed IPv6 bracket
    ],
    ids=["bad-port", "no-scheme-separator", "unsupported-driver", "bad-ipv6"],
)
@pytest.mark.parametrize("command", [["db", "upgrade"], ["serve"]], ids=" ".join)
def test_a_malformed_database_url_never_shows_its_password(url: str, command: list[str], tmp_path: Path) -> None:
    for result, name in (
        (_cli(*command, "--db", url, cwd=tmp_path), "--db"),
        (_cli(*command, cwd=tmp_path, HEDGEROW_DATABASE_URL=url), "HEDGEROW_DATABASE_URL"),
    ):
        output = result.stdout + result.stderr
        assert result.returncode == 2, output
        assert "Hunter2Secret" not in output and "Traceback" not in output
        assert result.stderr.startswith(f"hedgerow: {name}: database url "), output
        assert "admin:***@" in result.stderr, output  # what was wrong stays recognisable


def test_an_upgrade_waits_a_bounded_time_for_the_postgresql_lock(tmp_path: Path) -> None:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set")
    import asyncpg
    from sqlalchemy.engine import make_url

    from hedgerow.controller.store.db import _MIGRATION_LOCK

    url = asyncio.run(create_pg_database(base, "hedgerow_lock"))

    async def blocked_upgrade() -> subprocess.CompletedProcess[str]:
        parsed = make_url(url)
        holder = await asyncpg.connect(
            user=parsed.username, host=parsed.host, port=parsed.port or 5432, database=parsed.database
        )
        try:
            await holder.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)  # another migration
            return await asyncio.to_thread(
                _cli, "db", "upgrade", "--db", url, cwd=tmp_path, HEDGEROW_MIGRATION_LOCK_TIMEOUT_S="1"
            )
        finally:
            await holder.close()

    try:
        result = asyncio.run(blocked_upgrade())
        assert result.returncode == 1, result.stderr
        database = make_url(url).database
        assert database is not None
        assert database in result.stderr and "migration lock was not free within 1 s" in result.stderr
        assert _cli("db", "upgrade", "--db", url, cwd=tmp_path).returncode == 0  # free again: it migrates
    finally:
        asyncio.run(drop_pg_database(url))
