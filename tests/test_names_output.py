"""Names stored before the name rule are printed safely by every output, each escaping for its format.

The names (:data:`LEGACY`) are written into a store straight through the controller, as an old store
holds them: rich markup (``[bold]``, an unmatched ``[/x]`` that made rich raise), a Markdown pipe, a
spreadsheet formula, a newline, HTML, a matplotlib ``$...$``. Outputs: ``hedgerow routes list``
and ``controller run-once`` (rich tables), the text log lines, and the Markdown, CSV and HTML
weekly reports. The CLI's arguments refuse bad names (exit 2 naming the argument), and ``routes
show``/``set`` of a ``.../history`` path say so instead of a ``KeyError`` traceback.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.conftest import make_call
from tests.serve_process import ServeProcess

#: Names an old store may hold.
LEGACY = ["[bold]r1[/]", "a[/x]", "p|ipe", '=HYPERLINK("x")', "new\nline", "<b>html</b>", "a$\\x$b"]


async def _store_legacy(sessionmaker: async_sessionmaker[AsyncSession], *, started_at: datetime | None = None) -> None:
    """Calls of each :data:`LEGACY` name (route and model) through the controller: no api rule."""
    records = [
        make_call(f"legacy{i}-{j}", route=name, model=name, started_at=started_at)
        for i, name in enumerate(LEGACY)
        for j in range(3)
    ]
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))


def _fill_sqlite(url: str) -> None:
    from hedgerow.controller.store.db import make_engine, make_sessionmaker, migrate_engine

    async def run() -> None:
        engine = make_engine(url)
        try:
            await migrate_engine(engine)
            await _store_legacy(make_sessionmaker(engine))
        finally:
            await engine.dispose()

    asyncio.run(run())


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")} | {"COLUMNS": "200"} | env
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_routes_list_and_run_once_print_stored_names_as_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'legacy.db'}"
    _fill_sqlite(url)
    served = ServeProcess(url, tmp_path)
    try:
        listed = _cli("routes", "list", HEDGEROW_API_URL=served.url)
    finally:
        served.stop()
    assert listed.returncode == 0, listed.stderr
    assert "Traceback" not in listed.stderr
    for shown in ("[bold]r1[/]", "a[/x]", "p|ipe", '=HYPERLINK("x")', "new\\nline", "<b>html</b>", "a$\\x$b"):
        assert shown in listed.stdout, (shown, listed.stdout)
    assert "7 route(s)" in listed.stdout
    tick = _cli("controller", "run-once", "--db", url)
    assert tick.returncode == 0, tick.stderr
    assert "[bold]r1[/]" in tick.stdout and "a[/x]" in tick.stdout and "new\\nline" in tick.stdout, tick.stdout


def test_text_logs_quote_names_so_they_cannot_forge_fields_or_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from hedgerow.controller.events import log_flag_changes, log_threshold_change
    from hedgerow.logs import configure_logging

    configure_logging("info", "text")
    try:
        row = {
            "route": "new\nline 2026-12-01T00:00:00.000Z WARNING hedgerow.events lease_lost",
            "model": 'm actor=forged "x"',
            "previous_hedge_after_s": 1.0,
            "hedge_after_s": 0.5,
            "reason": "target",
            "source": "controller",
            "actor": "[bold]ops[/] \u202eevil",
        }
        log_threshold_change(row)
        log_flag_changes("p|ipe", '=HYPERLINK("x")', [], ["backups_rarely_win"])
    finally:
        logging.getLogger().handlers.clear()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    changed, flag = lines
    assert ' route="new\\nline 2026-12-01T00:00:00.000Z WARNING hedgerow.events lease_lost" ' in changed
    assert ' model="m actor=forged \\"x\\"" ' in changed
    assert changed.endswith(' actor="[bold]ops[/] \\u202eevil"') and "\u202e" not in changed
    pairs = re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|[^ "]+)', changed.split(" threshold_changed", 1)[1])
    assert [key for key, _ in pairs] == ["route", "model", "from_s", "to_s", "reason", "source", "actor"], pairs
    assert flag.endswith(' flag_raised route=p|ipe model="=HYPERLINK(\\"x\\")" flag=backups_rarely_win')


async def _report(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, Any]:
    from hedgerow.controller.report.report_store import weekly_report

    await _store_legacy(sessionmaker, started_at=datetime.now(UTC) - timedelta(minutes=5))
    return await weekly_report(sessionmaker)


async def test_markdown_report_escapes_names_so_rows_keep_their_columns(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    from hedgerow.controller.report.report_render import to_markdown

    text = to_markdown(await _report(sessionmaker))
    tables: list[list[str]] = []  # each run of table lines: the routes', then the upstreams'
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    rows = tables[0]
    assert len(rows) == 2 + len(LEGACY) + 1  # header, rule, a row per route, the total
    for table in tables:  # every row of every table keeps its header's columns
        columns = len(re.findall(r"(?<!\\)\|", table[0]))
        for row in table:
            assert len(re.findall(r"(?<!\\)\|", row)) == columns, row
    assert "| \\[bold\\]r1\\[/\\] | \\[bold\\]r1\\[/\\] |" in text
    assert "p\\|ipe" in text and "new\\\\nline" in text and "\\<b\\>html\\</b\\>" in text
    assert "\nline" not in text


async def test_csv_report_defuses_formulas_and_keeps_names_in_their_cells(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    from hedgerow.controller.report.report_render import CSV_COLUMNS, to_csv

    rows = list(csv.DictReader(io.StringIO(to_csv(await _report(sessionmaker)))))
    routes = {row["route"] for row in rows if row["scope"] == "route"}
    assert routes == {"'" + n if n.startswith("=") else n for n in LEGACY}
    assert all(len(row) == len(CSV_COLUMNS) for row in rows)
    assert not any(cell.startswith(("=", "+", "@")) for row in rows for cell in row.values())
    formula = next(row for row in rows if row["route"].startswith("'="))
    assert formula["route"] == formula["model"] == '\'=HYPERLINK("x")'


async def test_html_report_escapes_names_and_draws_dollar_signs(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    from hedgerow.controller.report.report_render import to_html

    page = to_html(await _report(sessionmaker))  # a$\x$b was mathtext: the page failed with ValueError
    assert "<b>html</b>" not in page and "&lt;b&gt;html&lt;/b&gt;" in page
    assert "new\\nline" in page and "[bold]r1[/]" in page


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["routes", "set", "a\u202eb", "--pin", "1"], "ROUTE: must not contain control characters or format"),
        (["routes", "set", " chat", "--pin", "1"], "ROUTE: must not start or end with whitespace"),
        (["routes", "set", "chat", "--model", "m\u2028", "--pin", "1"], "--model: must not contain"),
        (["routes", "set", "summarize/history", "--pin", "1"], "ROUTE: must not end in '/history'"),
        (["routes", "show", "a/history"], "ROUTE: must not end in '/history'"),
        (["routes", "show", "a\x1b[2Jb"], "ROUTE: must not contain control characters"),
        (["routes", "history", "a\nb"], "ROUTE: must not contain control characters"),
    ],
    ids=["set-bidi", "set-space", "set-model", "set-history", "show-history", "show-escape", "history-newline"],
)
def test_cli_arguments_refuse_bad_names_naming_the_argument(args: list[str], said: str) -> None:
    result = _cli(*args, HEDGEROW_API_URL="http://127.0.0.1:9")  # refused before any request
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith(f"hedgerow: {said}"), result.stderr
    assert "Traceback" not in result.stderr


def test_call_refuses_a_bad_route_naming_the_flag() -> None:
    result = _cli("call", "--upstream", "a=http://127.0.0.1:9/v1", "--model", "m", "--prompt", "hi", "--route", "r ")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("hedgerow: --route: must not start or end"), result.stderr
