"""``hedgerow routes``: the ops CLI for routes and their threshold history, against a running api.

Commands (each prints a rich table, or with ``--json`` the api's JSON for scripts):

- ``hedgerow routes list [--archived]``: every route in use (or archived) and its published threshold;
- ``hedgerow routes show ROUTE [--model M]``: one route's configuration and threshold;
- ``hedgerow routes history ROUTE [--model M] [--applied] [--reason CODE] [--since T] [--until T]
  [--limit N] [--explain]``: its decisions, newest first; ``--explain`` prints each decision
  followed by its plain-English sentences (the api's ``explanation``);
- ``hedgerow routes calls ROUTE [--model M] [--outcome O] [--winner U] [--upstream U]
  [--failed-upstream U] [--client NAME] [--since T] [--until T] [--limit N] [--cursor C]``: its
  recent calls, newest first, each with its client and attempts (which upstream, role, TTFT, how
  it ended); ``--client`` keeps one caller's (an app's tag, a gateway key's name); ``--cursor``
  pages on;
- ``hedgerow routes set ROUTE [--model M] [--budget F|P%] [--pin S | --unpin] [--enable | --disable]
  [--min S] [--max S] [--default S]``: change it (admin scope), audited;
- ``hedgerow routes archive ROUTE [--model M]``: retire it (admin scope), audited, history kept:
  out of the lists, the threshold table, the ticks and the route cap, its records refused;
- ``hedgerow routes restore ROUTE [--model M]``: undo an archive (admin scope), audited.

Where: ``--api URL`` (or ``HEDGEROW_API_URL``, default ``http://127.0.0.1:8400``) and ``--token T``
(or ``HEDGEROW_TOKEN``). ``--model`` may be left out when the route has one model. Exit status:
0 done, 1 the api refused or could not be reached (one line says why), 2 bad flags.

``history`` and ``calls`` live in :mod:`hedgerow.cli._routes_history`; the flags, the api client and
the table rules, shared with ``hedgerow upstreams``, in :mod:`hedgerow.cli._ops_api`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import typer

from hedgerow.cli._common import app, fail
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
    when_text,
)
from hedgerow.cli._ops_api import DEFAULT_API_URL as DEFAULT_API_URL
from hedgerow.cli._ops_api import plain_cell as plain_cell
from hedgerow.cli._routes_history import route_calls, route_history
from hedgerow.controller.ops_bounds import budget_range_error, parse_budget

__all__ = ["DEFAULT_API_URL", "plain_cell", "routes_app"]

routes_app = typer.Typer(
    help="Routes and their threshold history, from a running api (--api, --token).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(routes_app, name="routes")


@routes_app.command("list")
def list_routes(
    archived: bool = typer.Option(False, "--archived", help="List the archived routes instead."),
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Every route in use (or, with --archived, every archived route) with its published threshold,
    and its failed calls of the last hour (each route with any: the command listing them)."""
    from hedgerow.cli._route_failures import failed_calls_lines, failed_cell

    data = api_request("GET", api, token, "/v1/routes", params={"archived": "true"} if archived else None)
    if as_json:
        echo_json(data)
        return
    rows = []
    for r in data["routes"]:
        t = r["threshold"] or {}
        rows.append(
            [
                shown(r["route"]),
                shown(r["model"]),
                seconds_text(t.get("hedge_after_s")),
                t.get("source", "-"),
                str(t.get("version", "-")),
                percent_text(r["budget"]),
                "yes" if r["enabled"] else "no",
                seconds_text(r["pinned_hedge_after_s"]),
                f"{seconds_text(r['min_hedge_after_s'])}..{seconds_text(r['max_hedge_after_s'])}",
            ]
            + ([when_text(r.get("archived_at")), shown(r.get("archived_by") or "-")] if archived else [failed_cell(r)])
        )
    columns = ["route", "model", "hedge_after_s", "source", "version", "budget", "enabled", "pinned_s", "bounds_s"]
    columns += ["archived (UTC)", "actor"] if archived else ["failed (1 h)"]
    print_table(f"{len(rows)} {'archived ' if archived else ''}route(s)", columns, rows)
    for line in failed_calls_lines(data):
        typer.echo(line)


def _print_route(r: dict[str, Any]) -> None:
    t = r["threshold"] or {}
    rows = [
        ["published hedge_after_s", seconds_text(t.get("hedge_after_s"))],
        ["source", str(t.get("source", "-"))],
        ["version", str(t.get("version", "-"))],
        ["enabled", "yes" if r["enabled"] else "no"],
        ["budget", percent_text(r["budget"])],
        ["default_hedge_after_s", seconds_text(r["default_hedge_after_s"])],
        ["min_hedge_after_s", seconds_text(r["min_hedge_after_s"])],
        ["max_hedge_after_s", seconds_text(r["max_hedge_after_s"])],
        ["pinned_hedge_after_s", seconds_text(r["pinned_hedge_after_s"])],
        ["updated (UTC)", when_text(r["updated_at"])],
    ]
    if r.get("archived_at"):
        rows.append(["archived (UTC)", f"{when_text(r['archived_at'])} by {shown(r.get('archived_by') or '-')}"])
    print_table(f"{shown(r['route'])} · {shown(r['model'])}", ["setting", "value"], rows)
    from hedgerow.controller.policy.reason_codes import SOURCE_MEANINGS

    if t.get("source") in SOURCE_MEANINGS:
        typer.echo(f"source {t['source']}: {SOURCE_MEANINGS[t['source']]}")


@routes_app.command("show")
def show_route(
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """One route's configuration and published threshold."""
    check_route(route, model, change=False)
    data = api_request("GET", api, token, route_path(route), params=query_params(model))
    if as_json:
        echo_json(data)
        return
    _print_route(data)


# history and calls (hedgerow.cli._routes_history), registered here so that --help keeps the order
routes_app.command("history")(route_history)


def _setting(name: str, value: Any) -> str:
    """A route setting's value as ``routes show`` prints it: the budget in percent, durations in
    seconds, flags as yes/no, none as ``-``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "budget" and isinstance(value, int | float):
        return percent_text(value)
    if isinstance(value, int | float) or value is None:
        return seconds_text(value)
    return json.dumps(value)


def _seconds_flag(flag: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise fail(f"{flag}: must be a number of seconds > 0, got {value:g}", 2)
    return value


@routes_app.command("set")
def set_route(
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
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
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Change a route (admin scope): applied at once and audited in its history."""
    check_route(route, model, change=True)
    if pin is not None and unpin:
        raise fail("--pin and --unpin: give one of them", 2)
    if enable_flag and disable_flag:
        raise fail("--enable and --disable: give one of them", 2)
    enable = True if enable_flag else False if disable_flag else None
    budget = None
    if budget_text is not None:  # as the console's form: 0.05 or 5%
        try:
            budget = parse_budget(budget_text)
        except ValueError as exc:
            raise fail(f"--budget: {exc}", 2) from None
        out_of_range = budget_range_error(budget, budget_text)
        if out_of_range is not None:
            raise fail(f"--budget: {out_of_range}", 2)
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
        raise fail("nothing to change: give --budget, --pin/--unpin, --enable/--disable, --min, --max or --default", 2)
    if model is None:  # PATCH needs the model: take the route's only one
        model = api_request("GET", api, token, route_path(route))["model"]
    data = api_request("PATCH", api, token, route_path(route), params=query_params(model), json=body)
    if as_json:
        echo_json(data)
        return
    changes = data["changes"]
    if not changes:
        typer.echo(f"hedgerow: {shown(route)} · {shown(model)}: nothing changed")
        return
    rows = [[name, _setting(name, change["from"]), _setting(name, change["to"])] for name, change in changes.items()]
    print_table(f"{shown(route)} · {shown(model)}: changed", ["setting", "from", "to"], rows)
    _print_route(data["route"])


def _change_state(action: str, route: str, model: str | None, api: str, token: str | None, as_json: bool) -> None:
    """Archive or restore a route (see :func:`archive` and :func:`restore`)."""
    # archive: any stored name (a route from before the name rule can be retired); restore is a
    # PATCH, which takes valid names only
    check_route(route, model, change=action == "restore")
    if model is None:  # the api needs the model: take the route's only one
        model = api_request("GET", api, token, route_path(route))["model"]
    if action == "archive":
        data = api_request("DELETE", api, token, route_path(route), params=query_params(model))
    else:
        data = api_request("PATCH", api, token, route_path(route), params=query_params(model), json={"archived": False})
    if as_json:
        echo_json(data)
        return
    r = data["route"]
    name = f"{shown(route)} · {shown(model)}"
    if action == "archive":
        when = f"{when_text(r['archived_at'])} UTC by {shown(r.get('archived_by') or '-')}"
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
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Archive a route (admin scope), audited: it leaves the route lists, the threshold table (clients
    use their own default), the controller's ticks and the route cap, and records naming it are
    refused; its calls and history are kept. Archiving it again changes nothing."""
    _change_state("archive", route, model, api, token, as_json)


@routes_app.command("restore")
def restore(
    route: str = ROUTE_ARGUMENT,
    model: str = MODEL_OPTION,
    api: str = API_OPTION,
    token: str = TOKEN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Restore an archived route (admin scope), audited: listed, published and ticked again."""
    _change_state("restore", route, model, api, token, as_json)


routes_app.command("calls")(route_calls)
