"""What a new user tripped over in the CLI: busy port, bad --db, help, errors that name the flag."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")} | env
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_serve_on_a_busy_port_fails_before_creating_the_database(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = _cli("serve", "--db", f"sqlite:///{tmp_path / 'new.db'}", "--port", str(port), cwd=tmp_path)
    assert result.returncode == 1 and "cannot serve on 127.0.0.1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize(
    "command", [["serve"], ["db", "upgrade"], ["db", "retention"], ["controller", "run-once"]], ids=" ".join
)
def test_a_bad_db_exits_2_in_every_command(command: list[str], tmp_path: Path) -> None:
    result = _cli(*command, "--db", "mysql://u@h/db", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("hedgerow: --db: "), result.stderr
    from_env = _cli(*command, cwd=tmp_path, HEDGEROW_DATABASE_URL="not a url")
    assert from_env.returncode == 2 and "HEDGEROW_DATABASE_URL" in from_env.stderr, from_env.stderr


def test_plain_sqlite_urls_work_where_db_is_taken(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    assert _cli("db", "upgrade", "--db", url).returncode == 0
    result = _cli("controller", "run-once", "--db", url, "--json")
    assert result.returncode == 0 and '"history": []' in result.stdout


def test_errors_name_the_flag_or_the_variable_the_user_typed(tmp_path: Path) -> None:
    flag = _cli("serve", "--log-format", "xml", cwd=tmp_path)
    assert flag.returncode == 2 and flag.stderr.startswith("hedgerow: --log-format: "), flag.stderr
    env = _cli("serve", cwd=tmp_path, HEDGEROW_LOG_LEVEL="loud")
    assert env.returncode == 2 and env.stderr.startswith("hedgerow: HEDGEROW_LOG_LEVEL: "), env.stderr
    port = _cli("serve", "--port", "70000", cwd=tmp_path)
    assert port.returncode == 2 and "--port" in port.stderr


def test_help_shows_flags_without_type_metavars_and_untruncated() -> None:
    top = _cli("--help", COLUMNS="80")
    assert top.returncode == 0
    assert not [line for line in top.stdout.splitlines() if line.endswith("...") and "[ARGS]" not in line]
    assert "routes" in top.stdout and "--version" in top.stdout
    serve = _cli("serve", "--help", COLUMNS="80").stdout
    assert "--access-log / --no-access-log" in serve and "<bool>" not in serve
    assert "sqlite+aiosqlite:///./hedgerow.db" in serve  # not cut
    run_once = _cli("controller", "run-once", "--help").stdout
    assert "--json " in run_once and "--json <bool>" not in run_once


def test_no_option_of_any_command_shows_a_type_metavar() -> None:
    import re

    commands = [
        ("db", "upgrade"), ("db", "retention"), ("controller", "run-once"), ("report", "weekly"),
        ("routes", "list"), ("routes", "show"), ("routes", "history"), ("routes", "set"), ("serve",),
    ]  # fmt: skip
    for command in commands:
        text = _cli(*command, "--help").stdout
        options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
        assert options, command
        typed = [line for line in options if re.search(r"<(str|int|float|bool|path)>", line)]
        assert not typed, (command, typed)
