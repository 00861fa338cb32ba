"""``hedgerow routes history`` and ``hedgerow routes calls``: a route's decisions and its calls, read
from a running api and printed as tables (or, with ``--explain``, each decision in words).

The commands are registered on ``routes_app`` by :mod:`hedgerow.cli.routes` (in the order of
``hedgerow routes --help``); the flags, the api client and the table rules are those of
:mod:`hedgerow.cli._ops_api`.
"""

from __future__ import annotations

import shutil
import textwrap
from datetime import datetime
from typing import Any

import typer

from hedgerow.cli._common import fail
from hedgerow.cli._ops_api import (
    API_OPTION,
    JSON_OPTION,
    MODEL_OPTION,
    ROUTE_ARGUMENT,
    TOKEN_OPTION,
    api_request,
    check_route,
    echo_json,
    percent_text,
    print_table,
    query_params,
    route_path,
    seconds_text,
    shown,
    time_flag,
    when_text,
)
from hedgerow.controller.ops_bounds import MAX_HISTORY_LIMIT, history_filter_error

__all__ = ["route_calls", "route_history"]


def route_history(
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
    applied: bool = typer.Option(False, "--applied", help="Only applied changes (no holds)."),
    reason: str = typer.Option(None, "--reason", metavar="CODE", help="Only rows with this reason code."),
    since: str = typer.Option(
        None,
        "--since",
        metavar="TIME",
        help="Only decisions whose last tick is at or after TIME (ISO 8601; inclusive).",
    ),
    until: str = typer.Option(
        None,
        "--until",
        metavar="TIME",
        help="Only decisions whose first tick is at or before TIME (ISO 8601; inclusive).",
    ),
    limit: int = typer.Option(50, "--limit", metavar="N", help=f"Most rows (1 to {MAX_HISTORY_LIMIT})."),
    explain: bool = typer.Option(
        False, "--explain", help="Print each decision followed by why, in words, with its numbers."
    ),
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """A route's threshold decisions, newest first (identical holds are one row with repeats)."""
    check_route(route, model, change=False)
    if not 1 <= limit <= MAX_HISTORY_LIMIT:
        raise fail(f"--limit: must be from 1 to {MAX_HISTORY_LIMIT}, got {limit}", 2)
    reason = reason.strip() if reason is not None else None
    since_text = time_flag("--since", since)
    until_text = time_flag("--until", until)
    problem = history_filter_error(  # the api's rule, checked before the request
        reason=reason,
        since=datetime.fromisoformat(since_text) if since_text else None,
        until=datetime.fromisoformat(until_text) if until_text else None,
    )
    if problem is not None:
        raise fail(f"--{problem[0]}: {problem[1]}", 2)
    params = query_params(
        model, applied="true" if applied else None, reason=reason, since=since_text, until=until_text, limit=limit
    )
    data = api_request("GET", api, token, route_path(route, "/history"), params=params)
    if as_json:
        echo_json(data)
        return
    if explain:
        _print_explained(route, data["history"])
        return
    rows = [
        [
            _history_time(h),
            seconds_text(h["previous_hedge_after_s"]),
            seconds_text(h["hedge_after_s"]),
            "yes" if h["applied"] else "held",
            h["reason"].replace(",", ", "),  # wraps between codes, not inside one
            str(h.get("repeats", 1)),
            str(h["samples"]),
            seconds_text(h["p90_s"]),
            seconds_text(h["p99_s"]),
            percent_text(h["observed_hedge_rate"]),
            percent_text(h["backup_win_rate"]),
            shown(h["actor"] or "controller"),
        ]
        for h in data["history"]
    ]
    columns = [
        "time (UTC)", "from_s", "to_s", "applied", "reason", "repeats", "samples", "p90_s", "p99_s",
        "hedge rate", "backup wins", "actor",
    ]  # fmt: skip
    print_table(f"{shown(route)}: {len(rows)} decision(s)", columns, rows)
    from hedgerow.controller.policy.reason_codes import reason_legend

    for code, meaning in reason_legend(h["reason"] for h in data["history"]):
        typer.echo(f"{code}: {meaning}")


def _print_explained(route: str, history: list[dict[str, Any]]) -> None:
    """``routes history --explain``: each decision on one line, then its sentences indented.

    The sentences are the api's ``explanation`` (computed here from the row when an older api
    sends none). Everything printed is plain text with control and format characters escaped
    (:func:`shown`): an actor's name or a configuration value from the store cannot move the
    cursor or restyle the terminal, and nothing is read as rich markup (``typer.echo``).
    """
    from hedgerow.controller.policy.explain import explain_history_row

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    typer.echo(f"{shown(route)}: {len(history)} decision(s), newest first")
    for h in history:
        when = _history_time(h).replace("\n", " ")
        applied = "applied" if h["applied"] else "held"
        head = (
            f"{when}  {seconds_text(h['previous_hedge_after_s'])} -> {seconds_text(h['hedge_after_s'])} s  {applied}"
            f"  {h['reason'].replace(',', ', ')}  ({shown(h['actor'] or 'controller')})"
        )
        typer.echo("")
        typer.echo(shown(head))
        sentences = h.get("explanation")
        if not isinstance(sentences, list):
            sentences = explain_history_row(h)
        for sentence in sentences:
            typer.echo(textwrap.fill(shown(sentence), width, initial_indent="  - ", subsequent_indent="    "))


def _history_time(row: dict[str, Any]) -> str:
    """When a history row was decided; a repeated hold also shows its last tick (``to ...``),
    which is what ``--since`` matches."""
    first = str(row["computed_at"]).replace("T", " ")[:19]
    if row.get("repeats", 1) > 1 and row.get("last_at"):
        return f"{first}\nto {when_text(row['last_at'])}"
    return first


def _attempt_text(attempt: dict[str, Any]) -> str:
    """One attempt as a table line: ``b backup won ttft 0.3 s``, ``a primary failed http_503``,
    ``a primary cancelled censored >1.3 s`` (upstream and error type escaped, :func:`shown`)."""
    words = [shown(attempt["upstream"]), attempt["role"], attempt["outcome"]]
    if attempt["ttft_s"] is not None:
        words.append(f"ttft {seconds_text(attempt['ttft_s'])} s")
    elif attempt["censored"]:
        words.append(f"censored >{seconds_text(attempt['end_s'] - attempt['start_s'])} s")
    if attempt["error_type"]:
        words.append(shown(attempt["error_type"]))
    if attempt["start_s"] > 0:
        words.append(f"at +{seconds_text(attempt['start_s'])} s")
    return " ".join(words)


def route_calls(
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
    outcome: str = typer.Option(
        None,
        "--outcome",
        metavar="O",
        help="Only calls of this outcome: primary_won, hedge_won, failover, failed, cancelled.",
    ),
    winner: str = typer.Option(
        None, "--winner", metavar="U", help="Only calls whose winning attempt went to upstream U."
    ),
    upstream: str = typer.Option(
        None, "--upstream", metavar="U", help="Only calls with an attempt sent to upstream U."
    ),
    failed_upstream: str = typer.Option(
        None, "--failed-upstream", metavar="U", help="Only calls with an attempt on upstream U that failed."
    ),
    client: str = typer.Option(
        None, "--client", metavar="NAME", help="Only calls of this client (an app's tag, or a gateway key's name)."
    ),
    since: str = typer.Option(
        None, "--since", metavar="TIME", help="Only calls started at or after TIME (ISO 8601; inclusive)."
    ),
    until: str = typer.Option(
        None, "--until", metavar="TIME", help="Only calls started at or before TIME (ISO 8601; inclusive)."
    ),
    limit: int = typer.Option(50, "--limit", metavar="N", help="Most calls (1 to 500)."),
    cursor: str = typer.Option(None, "--cursor", metavar="C", help="Go on from a page: the cursor it printed."),
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """A route's recent calls, newest first, each with its attempts (which upstream won, which failed)."""
    from hedgerow.client.records import control_character_error
    from hedgerow.controller.calls_filters import calls_filter_error

    check_route(route, model, change=False)
    since_text = time_flag("--since", since)
    until_text = time_flag("--until", until)
    outcome = outcome.strip() if outcome is not None else None
    problem = calls_filter_error(  # the api's rule, checked before the request
        outcome=outcome,
        since=datetime.fromisoformat(since_text) if since_text else None,
        until=datetime.fromisoformat(until_text) if until_text else None,
        limit=limit,
    )
    if problem is not None:
        raise fail(f"--{problem[0]}: {problem[1]}", 2)
    names = {"winner": winner, "upstream": upstream, "failed-upstream": failed_upstream, "client": client}
    for flag, name in names.items():
        name_problem = None if name is None else control_character_error(name)
        if name_problem is not None:
            raise fail(f"--{flag}: {name_problem}", 2)
    params = query_params(
        model, outcome=outcome, winner=winner, upstream=upstream, failed_upstream=failed_upstream,
        client=client, since=since_text, until=until_text, limit=limit, cursor=cursor,
    )  # fmt: skip
    data = api_request("GET", api, token, route_path(route, "/calls"), params=params)
    if as_json:
        echo_json(data)
        return
    rows = [
        [
            when_text(c["started_at"]),
            shown(c["request_id"]),
            c["outcome"],
            shown(c["winner_upstream"] or "-"),
            seconds_text(c["ttft_s"]),
            seconds_text(c["e2e_s"]),
            shown(c["client"] or "-"),
            "\n".join(_attempt_text(a) for a in c["attempts"]) or "-",
        ]
        for c in data["calls"]
    ]
    columns = ["time (UTC)", "request_id", "outcome", "winner", "ttft_s", "e2e_s", "client", "attempts"]
    print_table(f"{shown(data['route'])} · {shown(data['model'])}: {len(rows)} call(s)", columns, rows)
    if data.get("retention_note"):
        typer.echo(data["retention_note"])
    if data.get("scan_stopped_at"):
        typer.echo(
            f"searched back to {when_text(data['scan_stopped_at'])} UTC; older calls are searched on the next page"
        )
    if data["next_cursor"]:
        typer.echo(f"more: --cursor {data['next_cursor']}")
