"""``hedgerow upstreams``: which upstream is slow or failing, from a running api.

- ``hedgerow upstreams list [--since T] [--until T] [--route R] [--json]``: per upstream over the
  calls started in ``[since, until)`` (default: the last 24 hours; at most 32 days), the attempts,
  TTFT P50/P90/P99 (Kaplan-Meier, attempts cancelled before their first token counted as
  censored), error/timeout/stall rates, win rate in races, hedges caused (as the slow primary) and
  the prompt and output tokens spent by its losing attempts (first-token hedging cancels the loser at
  the winner's first token, so its output is about 0: its prompt is the waste). An empty table
  says why (a window before the oldest stored call, nothing stored). ``GET /v1/upstreams``
  underneath; the definitions are those of :mod:`hedgerow.controller.store.upstreams`.

Where: ``--api URL`` (or ``HEDGEROW_API_URL``) and ``--token T`` (or ``HEDGEROW_TOKEN``), as
``hedgerow routes``. Names are printed with control and format characters escaped and never read
as rich markup. Exit status: 0 done, 1 the api refused or could not be reached, 2 bad flags.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer

from hedgerow.cli._common import app, fail
from hedgerow.cli._ops_api import API_OPTION, JSON_OPTION, TOKEN_OPTION, api_request, echo_json, plain_cell, time_flag

__all__ = ["format_quantile", "upstream_rows", "upstreams_app"]

upstreams_app = typer.Typer(
    help="Per-upstream TTFT, failures, wins and hedges, from a running api (--api, --token).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(upstreams_app, name="upstreams")

#: The table's columns, in order.
COLUMNS = [
    "upstream",
    "attempts",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "censored",
    "error",
    "timeout",
    "stall",
    "win_rate",
    "hedges_caused",
    "failovers",
    "loser_prompt_tokens",
    "loser_output_tokens",
]


def format_quantile(entry: dict[str, Any] | None) -> str:
    """A TTFT quantile of the api for a table: ``0.412``, ``>=2.5`` when only bounded below, ``-``
    without samples."""
    if entry is None:
        return "-"
    if entry["value_s"] is None:
        return f">={entry['low_s']:.3g}"
    return f"{entry['value_s']:.3f}"


def _print_table(title: str, rows: list[list[str]]) -> None:
    """Print the table: every cell plain text (:func:`~hedgerow.cli._ops_api.plain_cell`), names left."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=plain_cell(title))
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "upstream" else "right", overflow="fold")
    for row in rows:
        table.add_row(*(plain_cell(cell) for cell in row))
    Console(width=max(Console().width, 160)).print(table)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def upstream_rows(data: dict[str, Any]) -> list[list[str]]:
    """The rows of the table (one per upstream, as :data:`COLUMNS`) from ``GET /v1/upstreams``'s body.

    Names go through :func:`hedgerow.client.names.visible` (control and format characters escaped).
    """
    from hedgerow.client.names import visible

    rows = []
    for row in data["upstreams"]:
        q = row["ttft_s"]
        rows.append(
            [
                visible(row["upstream"]),
                str(row["attempts"]),
                format_quantile(q["p50"]),
                format_quantile(q["p90"]),
                format_quantile(q["p99"]),
                str(row["ttft_censored"]),
                _percent(row["error_rate"]),
                _percent(row["timeout_rate"]),
                _percent(row["stall_rate"]),
                "-" if row["win_rate"] is None else f"{row['win_rate']:.1%} of {row['raced']}",
                str(row["hedges_caused"]),
                str(row["failovers_caused"]),
                str(row["loser_prompt_tokens"]),
                str(row["loser_completion_tokens"]),
            ]
        )
    return rows


@upstreams_app.command("list")
def list_upstreams(
    since: str = typer.Option(
        None,
        "--since",
        metavar="TIME",
        help="Calls started at or after TIME (ISO 8601, UTC without a zone; inclusive).",
    ),
    until: str = typer.Option(
        None,
        "--until",
        metavar="TIME",
        help="Calls started before TIME (ISO 8601; exclusive: windows [since, until) tile; default now).",
    ),
    route: str = typer.Option(None, "--route", metavar="R", help="Only the calls of this route."),
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Every upstream's TTFT percentiles, failure rates, win rate and hedges over a window (default 24 h)."""
    from hedgerow.client.names import visible
    from hedgerow.client.records import control_character_error
    from hedgerow.controller.store.upstreams import coverage_note, window_error

    since_text = time_flag("--since", since)
    until_text = time_flag("--until", until)
    if since_text and until_text:
        problem = window_error(datetime.fromisoformat(since_text), datetime.fromisoformat(until_text))
        if problem is not None:
            raise fail(f"--{problem[0]}: {problem[1]}", 2)
    if route is not None and control_character_error(route) is not None:
        raise fail(f"--route: {control_character_error(route)}", 2)
    params = {k: v for k, v in {"since": since_text, "until": until_text, "route": route}.items() if v is not None}
    data = api_request("GET", api, token, "/v1/upstreams", params=params)
    if as_json:
        echo_json(data)
        return
    scope = f"route {visible(route)}" if route is not None else "every route"
    title = f"{len(data['upstreams'])} upstream(s), {scope}, {data['since'][:19]} to {data['until'][:19]} UTC"
    _print_table(title, upstream_rows(data))
    note = coverage_note(
        datetime.fromisoformat(data["since"]),
        datetime.fromisoformat(data["until"]),
        None if data["covered_from"] is None else datetime.fromisoformat(data["covered_from"]),
        len(data["upstreams"]),
    )
    if note is not None:
        typer.echo(note)
    if data["truncated"]:
        typer.echo("more upstreams than shown: the busiest are listed (use --json for the same list)")
    typer.echo(
        "ttft: Kaplan-Meier over attempts with a first token and those cancelled before one (censored); "
        ">=x: the data only bound it below. win_rate: wins of races (hedged calls). "
        "hedges_caused: hedges while it was the slow primary; loser_prompt_tokens / loser_output_tokens: prompt "
        "and output tokens of its attempts that lost in calls with a backup (the prompt is what a loser costs)."
    )
    unknown = sum(row["loser_attempts_without_prompt_tokens"] for row in data["upstreams"])
    if unknown:
        typer.echo(f"{unknown} losing attempt(s) carry no prompt tokens in their records: not in loser_prompt_tokens")
