"""The api client of the ops CLI (``hedgerow routes``, ``hedgerow upstreams``): one rule for URLs,
tokens, error lines, names in tables and time flags.

``api_request`` calls a running api and turns its refusals into one line and an exit status (2 for
a value the api refused, 1 otherwise, with a hint in the CLI's terms); the shared flags
(``--api``, ``--token``, ``ROUTE``, ``--model``, ``--json``) are defined once here; tables print
every cell as plain text (``plain_cell``, ``shown``) so that a stored name can neither restyle the
terminal nor be read as rich markup.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

import typer

from hedgerow.cli._common import fail

__all__ = [
    "API_OPTION",
    "DEFAULT_API_URL",
    "JSON_OPTION",
    "MODEL_OPTION",
    "ROUTE_ARGUMENT",
    "TOKEN_OPTION",
    "api_request",
    "check_route",
    "echo_json",
    "percent_text",
    "plain_cell",
    "print_table",
    "query_params",
    "route_path",
    "seconds_text",
    "shown",
    "time_flag",
    "when_text",
]


#: Where the api listens by default (``hedgerow serve``'s default address).
DEFAULT_API_URL = "http://127.0.0.1:8400"
_TIMEOUT_S = 30.0

#: The flags every ops command takes (``ROUTE`` and ``--model`` those about one route).
API_OPTION = typer.Option(
    DEFAULT_API_URL, "--api", metavar="URL", envvar="HEDGEROW_API_URL", help="The api's root URL (HEDGEROW_API_URL)."
)
TOKEN_OPTION = typer.Option(
    None, "--token", metavar="T", envvar="HEDGEROW_TOKEN", help="Bearer token (HEDGEROW_TOKEN).", show_default=False
)
ROUTE_ARGUMENT = typer.Argument(
    ..., metavar="ROUTE", help="The route's name, as `hedgerow routes list` shows it.", show_default=False
)
MODEL_OPTION = typer.Option(None, "--model", metavar="M", help="The route's model (optional when it has one).")
JSON_OPTION = typer.Option(False, "--json", help="Print the api's JSON instead of a table.")


def api_request(method: str, api: str, token: str | None, path: str, **kwargs: Any) -> Any:
    """Call the api; return the decoded JSON body.

    Raises:
        typer.Exit: status 2 with one line when the api refused a value (422: field and
            message), else status 1 with the api's error or why it could not be reached.
    """
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if not api.lower().startswith(("http://", "https://")):
        raise fail(f"--api: not an http:// or https:// URL, got {api!r}", 2)
    if api.rstrip("/").lower().endswith("/v1"):  # the upstreams' form; here it would ask for /v1/v1/...
        raise fail(f"--api: the api's root URL, without /v1 (e.g. http://127.0.0.1:8400), got {api!r}", 2)
    url = api.rstrip("/") + path
    try:
        response = httpx.request(method, url, headers=headers, timeout=_TIMEOUT_S, **kwargs)
    except httpx.InvalidURL as exc:
        raise fail(f"--api: not a URL ({exc})", 2) from None
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the api at {api}: {exc}") from None
    if response.status_code >= 400:
        typed = unquote(path)  # the route as typed: team/chat, not team%2Fchat
        # a 422 is a flag's value the api refused (a bad time, cursor, outcome, a missing --model):
        # the same status as a flag refused here
        code = 2 if response.status_code == 422 else 1
        raise fail(f"{method} {typed}: {response.status_code} {_error_text(response)}{_hint(response, token)}", code)
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


def check_route(route: str, model: str | None, *, change: bool) -> None:
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
        raise fail(f"ROUTE: {route_problem}", 2)
    if model_problem is not None:
        raise fail(f"--model: {model_problem}", 2)


def route_path(route: str, suffix: str = "") -> str:
    """The api path of ``route`` (its name quoted, ``/`` included) followed by ``suffix`` (``/history``)."""
    return f"/v1/routes/{quote(route, safe='')}{suffix}"


def query_params(model: str | None, **more: Any) -> dict[str, Any]:
    """The query parameters ``model`` and ``more`` without those that are None."""
    return {k: v for k, v in ({"model": model} | more).items() if v is not None}


def seconds_text(value: float | None) -> str:
    """Seconds for a table: up to three decimals without trailing zeros (``1.25``), ``-`` for none."""
    return "-" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def percent_text(value: float | None) -> str:
    """A fraction for a table as a percent with one decimal (``5.0%``), ``-`` for none."""
    return "-" if value is None else f"{value:.1%}"


def plain_cell(value: str) -> Any:
    """A table cell or title showing ``value`` as it is: plain text, never rich markup.

    Route and model names come from the store and may hold ``[bold]`` or ``[/]`` (as markup rich
    would style them, or fail on a closing tag that matches nothing): the cell is a
    ``rich.text.Text``, which rich does not parse. Newlines stay (a repeated hold's time is two
    lines); names and other stored text go through :func:`hedgerow.client.names.visible` first
    (:func:`shown`).

    Args:
        value: the text of the cell.

    Returns:
        A ``rich.text.Text``.
    """
    from rich.text import Text

    return Text(value)


def shown(value: Any) -> str:
    """Stored text (a name, an actor) for a table: control and format characters as escapes."""
    from hedgerow.client.names import visible

    return visible(str(value))


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
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


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (the ``--json`` output)."""
    typer.echo(json.dumps(data, indent=2))


def when_text(text: str | None) -> str:
    """An api timestamp (``2026-12-03T08:07:54.070048Z``) as the tables show times: ``2026-12-03 08:07:54``."""
    return "-" if not text else text.replace("T", " ")[:19]


def time_flag(flag: str, value: str | None) -> str | None:
    """An ISO 8601 date or time as the api takes it; one without a zone is UTC, as the table shows.

    Raises:
        typer.Exit: status 2 naming the flag when ``value`` is not ISO 8601.
    """
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise fail(
            f"{flag}: not an ISO 8601 date or time (e.g. 2026-12-01 or 2026-12-01T09:30Z), got {value!r}",
            2,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()
