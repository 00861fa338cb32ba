"""What a new user tripped over in the CLI: busy port, bad --db, help, errors that name the flag."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
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


@pytest.mark.parametrize(
    "command", [["report", "weekly"], ["db", "retention"], ["controller", "run-once"]], ids=" ".join
)
def test_a_store_not_migrated_exits_1_saying_to_upgrade_in_every_command(command: list[str], tmp_path: Path) -> None:
    """A SQLite file that exists but was never migrated is named as such, with the command that fixes it."""
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    result = _cli(*command, "--db", f"sqlite:///{tmp_path / 'empty.db'}")
    assert result.returncode == 1, result.stderr
    assert "revision none (empty)" in result.stderr and "run `hedgerow db upgrade`" in result.stderr, result.stderr


def test_retention_fold_only_says_it_deleted_nothing(tmp_path: Path) -> None:
    """``db retention --fold-only`` printed "deleted 0 call(s) ... started before <cutoff>", as if
    it had looked for old calls; it deletes nothing and now says so."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert _cli("db", "upgrade", "--db", url).returncode == 0
    result = _cli("db", "retention", "--db", url, "--fold-only")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hedgerow: folded 0 hour(s); deleted nothing (--fold-only)", result.stdout


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
    """Every option of every command shows a named metavar (``--upstream NAME=URL``), never
    typer's type (``<list[str]>``, ``<int>``, ``<float>``)."""
    import re

    commands = [
        ("db", "upgrade"), ("db", "retention"), ("controller", "run-once"), ("report", "weekly"),
        ("routes", "list"), ("routes", "show"), ("routes", "history"), ("routes", "set"), ("serve",),
        ("call",), ("replica",), ("demo",),
    ]  # fmt: skip
    for command in commands:
        text = _cli(*command, "--help").stdout
        options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
        assert options, command
        typed = [line for line in options if re.search(r"<[a-z]+(\[[a-z, ]+\])?>", line)]
        assert not typed, (command, typed)


def test_routes_flags_are_checked_before_any_request() -> None:
    """Contradictory or malformed ``hedgerow routes`` flags exit 2 naming the flag, with no api needed.

    ``--enable --disable`` used to apply the last one given (exit 0); ``--api notaurl`` and
    ``--limit 0`` were sent anyway and reported as an unreachable api or an api refusal (exit 1);
    a misspelt ``--reason`` gave an empty history (exit 0).
    """
    nowhere = "http://127.0.0.1:9"  # nothing listens: any request would exit 1
    for args, flag in (
        (["set", "r", "--enable", "--disable", "--api", nowhere], "--enable and --disable"),
        (["list", "--api", "notaurl"], "--api"),
        (["list", "--api", "ftp://example.org"], "--api"),
        (["list", "--api", f"{nowhere}/v1/"], "--api"),  # the upstreams' form: was GET /v1/v1/routes, a 404
        (["history", "r", "--limit", "0", "--api", nowhere], "--limit"),
        (["history", "r", "--since", "yesterday", "--api", nowhere], "--since"),
        (["history", "r", "--until", "2026-13-01", "--api", nowhere], "--until"),
        (["history", "r", "--since", "2026-12-04T14:25", "--until", "2026-12-04T14:24", "--api", nowhere], "--since"),
        (["history", "r", "--reason", "budget_bond", "--api", nowhere], "--reason"),
    ):
        done = _cli("routes", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith(f"hedgerow: {flag}"), (args, done.stderr)


@pytest.mark.slow
def test_routes_history_takes_a_date_or_a_time_without_zone_as_utc(tmp_path: Path) -> None:
    """``--since 2026-12-01`` (what the "time (UTC)" column shows) was refused by the api for its
    missing zone (exit 1); a date or time without a zone is now UTC."""
    from datetime import UTC, datetime, timedelta

    import httpx

    from tests.conftest import make_call
    from tests.serve_process import ServeProcess

    served = ServeProcess(f"sqlite:///{tmp_path / 'h.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        now = datetime.now(UTC)
        calls = [make_call(f"c{i}", started_at=now - timedelta(seconds=i + 1)) for i in range(60)]
        assert httpx.post(f"{served.url}/v1/calls", json={"calls": [c.to_dict() for c in calls]}).status_code == 202
        assert httpx.post(f"{served.url}/v1/controller/run", timeout=120).json()["ran"] is True
        today, tomorrow = now.date().isoformat(), (now + timedelta(days=1)).date().isoformat()
        for since, rows in ((today, 1), (f"{today}T00:00", 1), (tomorrow, 0)):
            done = _cli("routes", "history", "summarize", "--since", since, "--json", "--api", served.url)
            assert done.returncode == 0, (since, done.stderr)
            assert len(json.loads(done.stdout)["history"]) == rows, since
    finally:
        served.stop()


@pytest.mark.slow
def test_routes_without_a_token_says_how_to_give_one(tmp_path: Path) -> None:
    """Against an api with tokens, ``hedgerow routes list`` without one said only "401
    authorization: missing or invalid bearer token"; it now names --token and HEDGEROW_TOKEN."""
    from tests.serve_process import ServeProcess

    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", "HEDGEROW_TOKENS": "r3ad-token:read"}
    served = ServeProcess(f"sqlite:///{tmp_path / 't.db'}", tmp_path, env)
    try:
        bare = _cli("routes", "list", "--api", served.url)
        assert bare.returncode == 1 and "--token" in bare.stderr and "HEDGEROW_TOKEN" in bare.stderr, bare.stderr
        wrong = _cli("routes", "list", "--api", served.url, "--token", "nope")
        assert wrong.returncode == 1 and "401" in wrong.stderr and "HEDGEROW_TOKEN" not in wrong.stderr
        good = _cli("routes", "list", "--api", served.url, "--token", "r3ad-token")
        assert good.returncode == 0, good.stderr
    finally:
        served.stop()


def test_the_history_limit_has_one_home_that_loads_no_web_framework() -> None:
    """The CLI's ``--limit`` bound repeated ``api/routes.py``'s ``MAX_HISTORY_LIMIT`` (10,000) as a
    literal, so the two could drift apart. Both now read ``hedgerow.controller.ops_bounds``, which the CLI
    imports without FastAPI: with the bound lowered there, the CLI and the api both follow."""
    script = """
import sys, typing
import hedgerow.controller.ops_bounds as bounds
bounds.MAX_HISTORY_LIMIT = 5
import hedgerow.cli.routes
from typer.testing import CliRunner
assert "fastapi" not in sys.modules, "the CLI's routes module loaded FastAPI"
done = CliRunner().invoke(hedgerow.cli.routes.routes_app, ["history", "r", "--limit", "6", "--api", "http://127.0.0.1:9"])
print(done.exit_code, done.output.strip())
from hedgerow.api.routes import get_route_history
query = typing.get_type_hints(get_route_history, include_extras=True)["limit"].__metadata__[0]
print([getattr(m, "le", None) for m in query.metadata])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    cli_line, api_line = done.stdout.splitlines()[-2:]
    assert cli_line.startswith("2 ") and "--limit: must be from 1 to 5, got 6" in cli_line, done.stdout
    assert "5" in api_line, done.stdout


@pytest.mark.slow
def test_routes_refusals_say_which_flag_helps_and_name_the_route_as_typed(tmp_path: Path) -> None:
    """``hedgerow routes show team/chat`` on a route with two models said "GET
    /v1/routes/team%2Fchat: 422 model: ... give model", and a read token's ``set`` "403 ... needs
    one of admin": the path showed the route escaped and neither said which flag to use. Now the
    route reads as typed and the hints name --model, and --token/HEDGEROW_TOKEN."""
    import httpx

    from tests.serve_process import ServeProcess

    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", "HEDGEROW_TOKENS": "adm1n-token:admin,r3ad-token:read"}
    served = ServeProcess(f"sqlite:///{tmp_path / 'm.db'}", tmp_path, env)
    try:
        admin = {"Authorization": "Bearer adm1n-token"}
        for model in ("m1", "m2"):
            made = httpx.put(f"{served.url}/v1/routes/team/chat", params={"model": model}, json={}, headers=admin)
            assert made.status_code == 201, made.text
        read = ("--api", served.url, "--token", "r3ad-token")
        ambiguous = _cli("routes", "show", "team/chat", *read)
        assert ambiguous.returncode == 2, ambiguous.stderr  # a flag (--model) missing: 2, as a bad flag
        assert ambiguous.stderr.startswith("hedgerow: GET /v1/routes/team/chat: 422 model:"), ambiguous.stderr
        assert "--model M" in ambiguous.stderr
        assert _cli("routes", "show", "team/chat", "--model", "m1", *read).returncode == 0
        refused = _cli("routes", "set", "team/chat", "--model", "m1", "--budget", "0.2", *read)
        assert refused.returncode == 1 and "403" in refused.stderr, refused.stderr
        assert "--token" in refused.stderr and "HEDGEROW_TOKEN" in refused.stderr, refused.stderr
        unknown = _cli("routes", "show", "team/chat", "--model", "m9", *read)
        assert unknown.returncode == 1 and "404" in unknown.stderr and "--model M" not in unknown.stderr
    finally:
        served.stop()


def test_routes_history_shows_a_held_rows_last_tick_and_wraps_reasons_between_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hold repeated over many ticks showed only when it began, so ``--since 19:50`` seemed to
    return a row from 19:47; and a reason such as ``hysteresis_hold,backups_rarely_win`` was cut
    inside a code ("backups_rarely_" / "win"). The time cell now adds "to <last tick>" and the
    codes are separated by ", " so the table wraps between them."""
    import httpx
    from typer.testing import CliRunner

    from hedgerow.cli.routes import routes_app

    row = {
        "computed_at": "2026-12-02T19:47:38.000000Z", "last_at": "2026-12-02T19:53:02.000000Z", "repeats": 18,
        "previous_hedge_after_s": 0.088, "hedge_after_s": 0.088, "applied": False,
        "reason": "hysteresis_hold,backups_rarely_win,hedges_did_not_lower_p99", "samples": 2611, "p90_s": 0.07,
        "p99_s": 0.152, "observed_hedge_rate": 0.026, "backup_win_rate": 0.088, "actor": None,
    }  # fmt: skip

    def answer(method: str, url: str, **_kwargs: object) -> httpx.Response:
        return httpx.Response(200, json={"history": [row]}, request=httpx.Request(method, url))

    monkeypatch.setattr(httpx, "request", answer)
    monkeypatch.setenv("COLUMNS", "150")
    done = CliRunner().invoke(routes_app, ["history", "summarize", "--api", "http://127.0.0.1:9"])
    assert done.exit_code == 0, done.output
    assert "to 2026-12-02 19:53:02" in done.output, done.output
    for code in ("hysteresis_hold", "backups_rarely_win", "hedges_did_not_lower_p99"):
        assert code in done.output, done.output  # whole, on one line
    # under the table, what each code shown means (reason_codes.REASON_MEANINGS)
    from hedgerow.controller.policy.reason_codes import REASON_MEANINGS

    for code in ("hysteresis_hold", "backups_rarely_win", "hedges_did_not_lower_p99"):
        assert f"{code}: {REASON_MEANINGS[code]}" in done.output.replace("\n", " "), done.output


@pytest.mark.slow
def test_routes_set_takes_a_budget_in_percent_as_the_console_does(tmp_path: Path) -> None:
    """``hedgerow routes show`` prints budgets as "10.0%" and the console's form takes "5%", but
    ``routes set --budget 5%`` was refused by the flag's type ("Input should be a valid number",
    exit 2). It now takes a fraction or a percent by the console's one rule; a malformed or
    out-of-range budget still exits 2 naming --budget, before any request."""
    import httpx

    from tests.serve_process import ServeProcess

    served = ServeProcess(f"sqlite:///{tmp_path / 'b.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        assert httpx.put(f"{served.url}/v1/routes/r", params={"model": "m1"}, json={}).status_code == 201
        for text, budget in (("5%", 0.05), ("12.5 %", 0.125), ("0.2", 0.2)):
            done = _cli("routes", "set", "r", "--budget", text, "--api", served.url)
            assert done.returncode == 0, (text, done.stderr)
            if text == "5%":  # the change in the units routes show uses (it printed 0.1 -> 0.05)
                assert "│ budget  │ 10.0% │ 5.0% │" in done.stdout, done.stdout
            assert httpx.get(f"{served.url}/v1/routes/r").json()["budget"] == pytest.approx(budget), text
    finally:
        served.stop()
    nowhere = "http://127.0.0.1:9"
    for text, message in (
        ("5%%", "not a number"),
        ("150%", "150% is over 100%: a budget is the share of calls that may hedge"),
        ("nan", "finite"),
    ):
        done = _cli("routes", "set", "r", "--budget", text, "--api", nowhere)
        assert done.returncode == 2, (text, done.stderr)
        assert done.stderr.startswith("hedgerow: --budget:") and message in done.stderr, (text, done.stderr)


def test_the_retention_line_names_the_days_whose_partitions_were_dropped() -> None:
    from hedgerow.cli.db import retention_line

    summary = {
        "folded_hours": 3,
        "deleted_calls": 40,
        "deleted_attempts": 52,
        "cutoff": "2026-11-19T09:00:00+00:00",
        "skipped_hours": 0,
        "dropped_days": ["2026-11-17", "2026-11-18"],
    }
    line = retention_line(summary, fold_only=False)
    assert line == (
        "hedgerow: folded 3 hour(s); deleted 40 call(s) and 52 attempt(s) started before "
        "2026-11-19T09:00:00+00:00; dropped the partitions of 2026-11-17, 2026-11-18"
    )
    assert "dropped" not in retention_line(summary | {"dropped_days": []}, fold_only=False)
    assert retention_line(summary, fold_only=True).endswith("deleted nothing (--fold-only)")


def test_demo_report_dir_is_checked_before_the_run(tmp_path: Path) -> None:
    """A report folder that cannot be made failed only after minutes of load, losing the run."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    started = time.monotonic()
    done = _cli("demo", "--quick", "--report-dir", str(blocker / "report"), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("hedgerow: --report-dir: cannot make the folder"), done.stderr
    assert time.monotonic() - started < 60  # refused at once, no replica or api started


def test_demo_trace_that_is_not_a_trace_is_refused_before_the_run(tmp_path: Path) -> None:
    """A file without the trace's columns failed after the banner with exit 1."""
    bad = tmp_path / "not-a-trace.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    done = _cli("demo", "--quick", "--trace", str(bad), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("hedgerow: --trace"), done.stderr
    assert "missing column 'TIMESTAMP'" in done.stderr and "workload" not in done.stdout  # no banner


def test_demo_perf_model_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    done = _cli("demo", "--quick", "--perf-model", str(tmp_path / "none.csv"), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("hedgerow: --perf-model: not a file"), done.stderr


@pytest.mark.slow
def test_routes_history_explain_prints_each_decision_then_its_sentences(tmp_path: Path) -> None:
    """``--explain``: each decision on a line, then the api's sentences for it, plain text: an
    actor written like rich markup prints as typed, and no escape sequence reaches the terminal."""
    import httpx

    from tests.serve_process import ServeProcess

    served = ServeProcess(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        made = httpx.put(f"{served.url}/v1/routes/team/chat", params={"model": "m1"}, json={"actor": "[bold]ops[/]"})
        assert made.status_code == 201, made.text
        pinned = httpx.patch(
            f"{served.url}/v1/routes/team/chat", params={"model": "m1"}, json={"pinned_hedge_after_s": 0.5}
        )
        assert pinned.status_code == 200, pinned.text
        rows = httpx.get(f"{served.url}/v1/routes/team/chat/history", params={"model": "m1"}).json()["history"]
        done = _cli("routes", "history", "team/chat", "--explain", "--api", served.url, COLUMNS="100")
    finally:
        served.stop()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b" not in out and out.startswith("team/chat: 2 decision(s), newest first\n"), out
    blocks = out.split("\n\n")[1:]
    assert len(blocks) == 2, out
    for block, row in zip(blocks, rows, strict=True):
        head, *body = block.splitlines()
        assert head.startswith(row["computed_at"].replace("T", " ")[:19]) and row["reason"].split(",")[0] in head
        # the sentences, wrapped at the terminal's width, each starting "  - "
        joined = " ".join(line.strip() for line in body)
        assert joined == " ".join(f"- {sentence}" for sentence in row["explanation"]), (joined, row["explanation"])
        assert all(len(line) <= 100 for line in body), body
    assert "(api)" in blocks[0].splitlines()[0] and "[bold]ops[/] created the route; its first value" in blocks[1], out
    assert "- An operator pinned the value at 0.5 s" in blocks[0], out
