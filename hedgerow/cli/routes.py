"""``hedgerow routes``: the ops CLI for routes and their threshold history, against a running api.

Commands (each prints a rich table, or with ``--json`` the api's JSON for scripts):

- ``hedgerow routes list [--archived]``: every route in use (or archived) and its published threshold;
- ``hedgerow routes show ROUTE [--model M]``: one route's configuration and threshold;
- ``hedgerow routes history ROUTE [--model M] [--applied] [--reason CODE] [--since T] [--until T]
  [--limit N] [--explain]``: its decisions, newest first; ``--explain`` prints each decision
  followed by its plain-English sentences (the api's ``explanation``);
- ``hedgerow routes calls ROUTE [--model M] [--outcome O] [--winner U] [--upstream U]
  [--failed-upstream U] [--since T] [--until T] [--limit N] [--cursor C]``: its recent calls,
  newest first, each with its attempts (which upstream, role, TTFT, how it ended); ``--cursor``
  pages on;
- ``hedgerow routes set ROUTE [--model M] [--budget F|P%] [--pin S | --unpin] [--enable | --disable]
  [--min S] [--max S] [--default S]``: change it (admin scope), audited;
- ``hedgerow routes archive ROUTE [--model M]``: retire it (admin scope), audited, history kept:
  out of the lists, the threshold table, the ticks and the route cap, its records refused;
- ``hedgerow routes restore ROUTE [--model M]``: undo an archive (admin scope), audited.

Where: ``--api URL`` (or ``HEDGEROW_API_URL``, default ``http://127.0.0.1:8400``) and ``--token T``
(or ``HEDGEROW_TOKEN``). ``--model`` may be left out when the route has one model. Exit status:
0 done, 1 the api refused or could not be reached (one line says why), 2 bad flags.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

import typer

from hedgerow.cli._common import app
from hedgerow.controller.ops_bounds import MAX_HISTORY_LIMIT, budget_range_error, history_filter_error, parse_budget

__all__ = ["DEFAULT_API_URL", "plain_cell", "routes_app"]

#: Where the api listens by default (``hedgerow serve``'s default address).
DEFAULT_API_URL = "http://127.0.0.1:8400"
_TIMEOUT_S = 30.0

routes_app = typer.Typer(
    help="Routes and their threshold history, from a running api (--api, --token).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(routes_app, name="routes")

_API = typer.Option(
    DEFAULT_API_URL, "--api", metavar="URL", envvar="HEDGEROW_API_URL", help="The api's root URL (HEDGEROW_API_URL)."
)
_TOKEN = typer.Option(
    None, "--token", metavar="T", envvar="HEDGEROW_TOKEN", help="Bearer token (HEDGEROW_TOKEN).", show_default=False
)
_ROUTE = typer.Argument(
    ..., metavar="ROUTE", help="The route's name, as `hedgerow routes list` shows it.", show_default=False
)
_MODEL = typer.Option(None, "--model", metavar="M", help="The route's model (optional when it has one).")
_JSON = typer.Option(False, "--json", help="Print the api's JSON instead of a table.")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"hedgerow: {message}", err=True)
    return typer.Exit(code)


def _request(method: str, api: str, token: str | None, path: str, **kwargs: Any) -> Any:
    """Call the api; return the decoded JSON body.

    Raises:
        typer.Exit: status 2 with one line when the api refused a value (422: field and
            message), else status 1 with the api's error or why it could not be reached.
    """
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if not api.lower().startswith(("http://", "https://")):
        raise _fail(f"--api: not an http:// or https:// URL, got {api!r}", 2)
    if api.rstrip("/").lower().endswith("/v1"):  # the upstreams' form; here it would ask for /v1/v1/...
        raise _fail(f"--api: the api's root URL, without /v1 (e.g. http://127.0.0.1:8400), got {api!r}", 2)
    url = api.rstrip("/") + path
    try:
        response = httpx.request(method, url, headers=headers, timeout=_TIMEOUT_S, **kwargs)
    except httpx.InvalidURL as exc:
        raise _fail(f"--api: not a URL ({exc})", 2) from None
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach the api at {api}: {exc}") from None
    if response.status_code >= 400:
        shown = unquote(path)  # the route as typed: team/chat, not team%2Fchat
        # a 422 is a flag's value the api refused (a bad time, cursor, outcome, a missing --model):
        # the same status as a flag refused here
        code = 2 if response.status_code == 422 else 1
        raise _fail(f"{method} {shown}: {response.status_code} {_error_text(response)}{_hint(response, token)}", code)
    return response.json()


def _hint(response: Any, token: str | None) -> str:
    """What the user can do about an api refusal, in the CLI's terms (flags, variables); or ''."""
    if response.status_code == 401 and not token:
        return " (give --token T or set HEDGEROW_TOKEN)"
    if response.status_code == 403:
        return " (use a token with that scope: --token T or HEDGEROW_TOKEN)"
    if response.status_code == 422 and "model" not in response.request.url.params:
        try:
            field = response.json()["detail"]["field"]
        except (ValueError, KeyError, TypeError):
            return ""
        return " (with --model M)" if field == "model" else ""
    return ""


def _error_text(response: Any) -> str:
    """``field: message`` of an api error body, else its text (cut to one line)."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        return str(response.text.splitlines()[0][:300] if response.text else response.reason_phrase)
    if isinstance(detail, dict):
        return f"{detail.get('field', '')}: {detail.get('message', '')}".strip(": ")
    return str(detail)


def _check_route(route: str, model: str | None, *, change: bool) -> None:
    """Exit 2 naming ``ROUTE`` or ``--model`` when the api could not take them.

    A change (``routes set``) takes valid names only (:mod:`hedgerow.client.names`, as the api's
    ``PATCH``); a read (``show``, ``history``) takes any name without a control character (a route
    stored before the name rule stays readable), but never one ending in ``/history`` or
    ``/calls``: the api reads ``a/history`` as the history of ``a``, an answer of another shape.

    Raises:
        typer.Exit: status 2 with one line naming the argument and what is wrong.
    """
    from hedgerow.client.names import CALLS_SUFFIX, HISTORY_SUFFIX, model_name_error, route_name_error
    from hedgerow.client.records import control_character_error

    if change:
        route_problem, model_problem = route_name_error(route), None if model is None else model_name_error(model)
    else:
        route_problem = control_character_error(route)
        if route_problem is None and route.endswith(HISTORY_SUFFIX):
            route_problem = (
                f"must not end in {HISTORY_SUFFIX!r} (no route does; for the history of a route R "
                "use `hedgerow routes history R`)"
            )
        elif route_problem is None and route.endswith(CALLS_SUFFIX):
            route_problem = (
                f"must not end in {CALLS_SUFFIX!r} (no route does; for the calls of a route R "
                "use `hedgerow routes calls R`)"
            )
        model_problem = None if model is None else control_character_error(model)
    if route_problem is not None:
        raise _fail(f"ROUTE: {route_problem}", 2)
    if model_problem is not None:
        raise _fail(f"--model: {model_problem}", 2)


def _route_path(route: str, suffix: str = "") -> str:
    return f"/v1/routes/{quote(route, safe='')}{suffix}"


def _params(model: str | None, **more: Any) -> dict[str, Any]:
    return {k: v for k, v in ({"model": model} | more).items() if v is not None}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def plain_cell(value: str) -> Any:
    """A table cell or title showing ``value`` as it is: plain text, never rich markup.

    Route and model names come from the store and may hold ``[bold]`` or ``[/]`` (as markup rich
    would style them, or fail on a closing tag that matches nothing): the cell is a
    ``rich.text.Text``, which rich does not parse. Newlines stay (a repeated hold's time is two
    lines); names and other stored text go through :func:`hedgerow.client.names.visible` first
    (:func:`_shown`).

    Args:
        value: the text of the cell.

    Returns:
        A ``rich.text.Text``.
    """
    from rich.text import Text

    return Text(value)


def _shown(value: Any) -> str:
    """Stored text (a name, an actor) for a table: control and format characters as escapes."""
    from hedgerow.client.names import visible

    return visible(str(value))


def _print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """Print a rich table; every cell and the title are plain text (:func:`plain_cell`)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=plain_cell(title))
    left = {
        "route",
        "model",
        "source",
        "reason",
        "actor",
        "time (UTC)",
        "setting",
        "value",
        "last",
        "enabled",
        "request_id",
        "outcome",
        "winner",
        "attempts",
    }
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right", overflow="fold")
    for row in rows:
        table.add_row(*(plain_cell(cell) for cell in row))
    Console(width=max(Console().width, 160)).print(table)


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


@routes_app.command("list")
def list_routes(
    archived: bool = typer.Option(False, "--archived", help="List the archived routes instead."),
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """Every route in use (or, with --archived, every archived route) with its published threshold,
    and its failed calls of the last hour (each route with any: the command listing them)."""
    from hedgerow.cli._route_failures import failed_calls_lines, failed_cell

    data = _request("GET", api, token, "/v1/routes", params={"archived": "true"} if archived else None)
    if as_json:
        _echo_json(data)
        return
    rows = []
    for r in data["routes"]:
        t = r["threshold"] or {}
        rows.append(
            [
                _shown(r["route"]),
                _shown(r["model"]),
                _seconds(t.get("hedge_after_s")),
                t.get("source", "-"),
                str(t.get("version", "-")),
                _percent(r["budget"]),
                "yes" if r["enabled"] else "no",
                _seconds(r["pinned_hedge_after_s"]),
                f"{_seconds(r['min_hedge_after_s'])}..{_seconds(r['max_hedge_after_s'])}",
            ]
            + ([_when(r.get("archived_at")), _shown(r.get("archived_by") or "-")] if archived else [failed_cell(r)])
        )
    columns = ["route", "model", "hedge_after_s", "source", "version", "budget", "enabled", "pinned_s", "bounds_s"]
    columns += ["archived (UTC)", "actor"] if archived else ["failed (1 h)"]
    _print_table(f"{len(rows)} {'archived ' if archived else ''}route(s)", columns, rows)
    for line in failed_calls_lines(data):
        typer.echo(line)


def _print_route(r: dict[str, Any]) -> None:
    t = r["threshold"] or {}
    rows = [
        ["published hedge_after_s", _seconds(t.get("hedge_after_s"))],
        ["source", str(t.get("source", "-"))],
        ["version", str(t.get("version", "-"))],
        ["enabled", "yes" if r["enabled"] else "no"],
        ["budget", _percent(r["budget"])],
        ["default_hedge_after_s", _seconds(r["default_hedge_after_s"])],
        ["min_hedge_after_s", _seconds(r["min_hedge_after_s"])],
        ["max_hedge_after_s", _seconds(r["max_hedge_after_s"])],
        ["pinned_hedge_after_s", _seconds(r["pinned_hedge_after_s"])],
        ["updated (UTC)", _when(r["updated_at"])],
    ]
    if r.get("archived_at"):
        rows.append(["archived (UTC)", f"{_when(r['archived_at'])} by {_shown(r.get('archived_by') or '-')}"])
    _print_table(f"{_shown(r['route'])} · {_shown(r['model'])}", ["setting", "value"], rows)
    from hedgerow.controller.policy.reason_codes import SOURCE_MEANINGS

    if t.get("source") in SOURCE_MEANINGS:
        typer.echo(f"source {t['source']}: {SOURCE_MEANINGS[t['source']]}")


@routes_app.command("show")
def show_route(
    route: str = _ROUTE,
    model: str = _MODEL,
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """One route's configuration and published threshold."""
    _check_route(route, model, change=False)
    data = _request("GET", api, token, _route_path(route), params=_params(model))
    if as_json:
        _echo_json(data)
        return
    _print_route(data)


@routes_app.command("history")
def route_history(
    route: str = _ROUTE,
    model: str = _MODEL,
    applied: bool = typer.Option(False, "--applied", help="Only applied changes (no holds)."),
    reason: str = typer.Option(None, "--reason", metavar="CODE", help="Only rows with this reason code."),
    since: str = typer.Option(None, "--since", metavar="TIME", help="Only decisions seen at or after (ISO 8601)."),
    until: str = typer.Option(None, "--until", metavar="TIME", help="Only decisions made at or before (ISO 8601)."),
    limit: int = typer.Option(50, "--limit", metavar="N", help=f"Most rows (1 to {MAX_HISTORY_LIMIT})."),
    explain: bool = typer.Option(
        False, "--explain", help="Print each decision followed by why, in words, with its numbers."
    ),
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """A route's threshold decisions, newest first (identical holds are one row with repeats)."""
    _check_route(route, model, change=False)
    if not 1 <= limit <= MAX_HISTORY_LIMIT:
        raise _fail(f"--limit: must be from 1 to {MAX_HISTORY_LIMIT}, got {limit}", 2)
    reason = reason.strip() if reason is not None else None
    since_text = _time_flag("--since", since)
    until_text = _time_flag("--until", until)
    problem = history_filter_error(  # the api's rule, checked before the request
        reason=reason,
        since=datetime.fromisoformat(since_text) if since_text else None,
        until=datetime.fromisoformat(until_text) if until_text else None,
    )
    if problem is not None:
        raise _fail(f"--{problem[0]}: {problem[1]}", 2)
    params = _params(
        model, applied="true" if applied else None, reason=reason, since=since_text, until=until_text, limit=limit
    )
    data = _request("GET", api, token, _route_path(route, "/history"), params=params)
    if as_json:
        _echo_json(data)
        return
    if explain:
        _print_explained(route, data["history"])
        return
    rows = [
        [
            _history_time(h),
            _seconds(h["previous_hedge_after_s"]),
            _seconds(h["hedge_after_s"]),
            "yes" if h["applied"] else "held",
            h["reason"].replace(",", ", "),  # wraps between codes, not inside one
            str(h.get("repeats", 1)),
            str(h["samples"]),
            _seconds(h["p90_s"]),
            _seconds(h["p99_s"]),
            _percent(h["observed_hedge_rate"]),
            _percent(h["backup_win_rate"]),
            _shown(h["actor"] or "controller"),
        ]
        for h in data["history"]
    ]
    columns = [
        "time (UTC)", "from_s", "to_s", "applied", "reason", "repeats", "samples", "p90_s", "p99_s",
        "hedge rate", "backup wins", "actor",
    ]  # fmt: skip
    _print_table(f"{_shown(route)}: {len(rows)} decision(s)", columns, rows)
    from hedgerow.controller.policy.reason_codes import reason_legend

    for code, meaning in reason_legend(h["reason"] for h in data["history"]):
        typer.echo(f"{code}: {meaning}")


def _print_explained(route: str, history: list[dict[str, Any]]) -> None:
    """``routes history --explain``: each decision on one line, then its sentences indented.

    The sentences are the api's ``explanation`` (computed here from the row when an older api
    sends none). Everything printed is plain text with control and format characters escaped
    (:func:`_shown`): an actor's name or a configuration value from the store cannot move the
    cursor or restyle the terminal, and nothing is read as rich markup (``typer.echo``).
    """
    from hedgerow.controller.policy.explain import explain_history_row

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    typer.echo(f"{_shown(route)}: {len(history)} decision(s), newest first")
    for h in history:
        when = _history_time(h).replace("\n", " ")
        applied = "applied" if h["applied"] else "held"
        head = (
            f"{when}  {_seconds(h['previous_hedge_after_s'])} -> {_seconds(h['hedge_after_s'])} s  {applied}"
            f"  {h['reason'].replace(',', ', ')}  ({_shown(h['actor'] or 'controller')})"
        )
        typer.echo("")
        typer.echo(_shown(head))
        sentences = h.get("explanation")
        if not isinstance(sentences, list):
            sentences = explain_history_row(h)
        for sentence in sentences:
            typer.echo(textwrap.fill(_shown(sentence), width, initial_indent="  - ", subsequent_indent="    "))


def _when(text: str | None) -> str:
    """An api timestamp (``2026-12-03T08:07:54.070048Z``) as the tables show times: ``2026-12-03 08:07:54``."""
    return "-" if not text else text.replace("T", " ")[:19]


def _setting(name: str, value: Any) -> str:
    """A route setting's value as ``routes show`` prints it: the budget in percent, durations in
    seconds, flags as yes/no, none as ``-``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "budget" and isinstance(value, int | float):
        return _percent(value)
    if isinstance(value, int | float) or value is None:
        return _seconds(value)
    return json.dumps(value)


def _history_time(row: dict[str, Any]) -> str:
    """When a history row was decided; a repeated hold also shows its last tick (``to ...``),
    which is what ``--since`` matches."""
    first = str(row["computed_at"]).replace("T", " ")[:19]
    if row.get("repeats", 1) > 1 and row.get("last_at"):
        return f"{first}\nto {_when(row['last_at'])}"
    return first


def _time_flag(flag: str, value: str | None) -> str | None:
    """An ISO 8601 date or time as the api takes it; one without a zone is UTC, as the table shows.

    Raises:
        typer.Exit: status 2 naming the flag when ``value`` is not ISO 8601.
    """
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise _fail(
            f"{flag}: not an ISO 8601 date or time (e.g. 2026-12-01 or 2026-12-01T09:30Z), got {value!r}",
            2,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


def _seconds_flag(flag: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise _fail(f"{flag}: must be a number of seconds > 0, got {value:g}", 2)
    return value


@routes_app.command("set")
def set_route(
    route: str = _ROUTE,
    model: str = _MODEL,
    budget_text: str = typer.Option(
        None, "--budget", metavar="F", help="Hedge budget in (0, 1): a fraction or a percent (0.05 or 5%)."
    ),
    pin: float = typer.Option(None, "--pin", metavar="S", help="Publish this hedge_after_s as is (seconds)."),
    unpin: bool = typer.Option(False, "--unpin", help="Let the controller decide again."),
    enable_flag: bool = typer.Option(False, "--enable", help="Turn hedging on for the route."),
    disable_flag: bool = typer.Option(False, "--disable", help="Turn hedging off for the route."),
    low: float = typer.Option(None, "--min", metavar="S", help="Lowest hedge_after_s, seconds."),
    high: float = typer.Option(None, "--max", metavar="S", help="Highest hedge_after_s, seconds."),
    default: float = typer.Option(None, "--default", metavar="S", help="Value while samples are too few, seconds."),
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """Change a route (admin scope): applied at once and audited in its history."""
    _check_route(route, model, change=True)
    if pin is not None and unpin:
        raise _fail("--pin and --unpin: give one of them", 2)
    if enable_flag and disable_flag:
        raise _fail("--enable and --disable: give one of them", 2)
    enable = True if enable_flag else False if disable_flag else None
    budget = None
    if budget_text is not None:  # as the console's form: 0.05 or 5%
        try:
            budget = parse_budget(budget_text)
        except ValueError as exc:
            raise _fail(f"--budget: {exc}", 2) from None
        out_of_range = budget_range_error(budget, budget_text)
        if out_of_range is not None:
            raise _fail(f"--budget: {out_of_range}", 2)
    body: dict[str, Any] = {}
    for name, flag, value in (
        ("pinned_hedge_after_s", "--pin", pin),
        ("min_hedge_after_s", "--min", low),
        ("max_hedge_after_s", "--max", high),
        ("default_hedge_after_s", "--default", default),
    ):
        if _seconds_flag(flag, value) is not None:
            body[name] = value
    if unpin:
        body["pinned_hedge_after_s"] = None
    if budget is not None:
        body["budget"] = budget
    if enable is not None:
        body["enabled"] = enable
    if not body:
        raise _fail("nothing to change: give --budget, --pin/--unpin, --enable/--disable, --min, --max or --default", 2)
    if model is None:  # PATCH needs the model: take the route's only one
        model = _request("GET", api, token, _route_path(route))["model"]
    data = _request("PATCH", api, token, _route_path(route), params=_params(model), json=body)
    if as_json:
        _echo_json(data)
        return
    changes = data["changes"]
    if not changes:
        typer.echo(f"hedgerow: {_shown(route)} · {_shown(model)}: nothing changed")
        return
    rows = [[name, _setting(name, change["from"]), _setting(name, change["to"])] for name, change in changes.items()]
    _print_table(f"{_shown(route)} · {_shown(model)}: changed", ["setting", "from", "to"], rows)
    _print_route(data["route"])


def _change_state(action: str, route: str, model: str | None, api: str, token: str | None, as_json: bool) -> None:
    """Archive or restore a route (see :func:`archive` and :func:`restore`)."""
    # archive: any stored name (a route from before the name rule can be retired); restore is a
    # PATCH, which takes valid names only
    _check_route(route, model, change=action == "restore")
    if model is None:  # the api needs the model: take the route's only one
        model = _request("GET", api, token, _route_path(route))["model"]
    if action == "archive":
        data = _request("DELETE", api, token, _route_path(route), params=_params(model))
    else:
        data = _request("PATCH", api, token, _route_path(route), params=_params(model), json={"archived": False})
    if as_json:
        _echo_json(data)
        return
    r = data["route"]
    name = f"{_shown(route)} · {_shown(model)}"
    if action == "archive":
        when = f"{_when(r['archived_at'])} UTC by {_shown(r.get('archived_by') or '-')}"
        if data["history"] is None:
            typer.echo(f"hedgerow: {name}: already archived ({when}); nothing changed")
        else:
            typer.echo(
                f"hedgerow: {name}: archived ({when}): no longer listed, published or ticked, its records are refused;"
                " its history is kept (`hedgerow routes restore` undoes it)"
            )
    elif data["history"] is None:
        typer.echo(f"hedgerow: {name}: not archived; nothing changed")
    else:
        typer.echo(f"hedgerow: {name}: restored: listed, published and ticked again, its records taken")


@routes_app.command("archive")
def archive(
    route: str = _ROUTE,
    model: str = _MODEL,
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """Archive a route (admin scope), audited: it leaves the route lists, the threshold table (clients
    use their own default), the controller's ticks and the route cap, and records naming it are
    refused; its calls and history are kept. Archiving it again changes nothing."""
    _change_state("archive", route, model, api, token, as_json)


@routes_app.command("restore")
def restore(
    route: str = _ROUTE,
    model: str = _MODEL,
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """Restore an archived route (admin scope), audited: listed, published and ticked again."""
    _change_state("restore", route, model, api, token, as_json)


def _attempt_text(attempt: dict[str, Any]) -> str:
    """One attempt as a table line: ``b backup won ttft 0.3 s``, ``a primary failed http_503``,
    ``a primary cancelled censored >1.3 s`` (upstream and error type escaped, :func:`_shown`)."""
    words = [_shown(attempt["upstream"]), attempt["role"], attempt["outcome"]]
    if attempt["ttft_s"] is not None:
        words.append(f"ttft {_seconds(attempt['ttft_s'])} s")
    elif attempt["censored"]:
        words.append(f"censored >{_seconds(attempt['end_s'] - attempt['start_s'])} s")
    if attempt["error_type"]:
        words.append(_shown(attempt["error_type"]))
    if attempt["start_s"] > 0:
        words.append(f"at +{_seconds(attempt['start_s'])} s")
    return " ".join(words)


@routes_app.command("calls")
def route_calls(
    route: str = _ROUTE,
    model: str = _MODEL,
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
    since: str = typer.Option(None, "--since", metavar="TIME", help="Only calls started at or after (ISO 8601)."),
    until: str = typer.Option(None, "--until", metavar="TIME", help="Only calls started at or before (ISO 8601)."),
    limit: int = typer.Option(50, "--limit", metavar="N", help="Most calls (1 to 500)."),
    cursor: str = typer.Option(None, "--cursor", metavar="C", help="Go on from a page: the cursor it printed."),
    api: str = _API,
    token: str = _TOKEN,
    as_json: bool = _JSON,
) -> None:
    """A route's recent calls, newest first, each with its attempts (which upstream won, which failed)."""
    from hedgerow.client.records import control_character_error
    from hedgerow.controller.calls_filters import calls_filter_error

    _check_route(route, model, change=False)
    since_text = _time_flag("--since", since)
    until_text = _time_flag("--until", until)
    outcome = outcome.strip() if outcome is not None else None
    problem = calls_filter_error(  # the api's rule, checked before the request
        outcome=outcome,
        since=datetime.fromisoformat(since_text) if since_text else None,
        until=datetime.fromisoformat(until_text) if until_text else None,
        limit=limit,
    )
    if problem is not None:
        raise _fail(f"--{problem[0]}: {problem[1]}", 2)
    upstreams = {"winner": winner, "upstream": upstream, "failed-upstream": failed_upstream}
    for flag, name in upstreams.items():
        name_problem = None if name is None else control_character_error(name)
        if name_problem is not None:
            raise _fail(f"--{flag}: {name_problem}", 2)
    params = _params(
        model, outcome=outcome, winner=winner, upstream=upstream, failed_upstream=failed_upstream,
        since=since_text, until=until_text, limit=limit, cursor=cursor,
    )  # fmt: skip
    data = _request("GET", api, token, _route_path(route, "/calls"), params=params)
    if as_json:
        _echo_json(data)
        return
    rows = [
        [
            _when(c["started_at"]),
            _shown(c["request_id"]),
            c["outcome"],
            _shown(c["winner_upstream"] or "-"),
            _seconds(c["ttft_s"]),
            _seconds(c["e2e_s"]),
            "\n".join(_attempt_text(a) for a in c["attempts"]) or "-",
        ]
        for c in data["calls"]
    ]
    columns = ["time (UTC)", "request_id", "outcome", "winner", "ttft_s", "e2e_s", "attempts"]
    _print_table(f"{_shown(data['route'])} · {_shown(data['model'])}: {len(rows)} call(s)", columns, rows)
    if data.get("retention_note"):
        typer.echo(data["retention_note"])
    if data.get("scan_stopped_at"):
        typer.echo(f"searched back to {_when(data['scan_stopped_at'])} UTC; older calls are searched on the next page")
    if data["next_cursor"]:
        typer.echo(f"more: --cursor {data['next_cursor']}")
