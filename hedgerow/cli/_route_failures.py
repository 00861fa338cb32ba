"""The failed calls of ``hedgerow routes list``: its ``failed (1 h)`` cell and, under the table, the
command that lists each route's failed calls of that window (the calls explorer, ``outcome=failed``).

The counts come with ``GET /v1/routes`` (``recent_calls``, ``recent_failed_calls`` and the window
``recent_since``/``recent_until``): a call failed when it ended without an answer (error, timeout
or stall; a failover that was answered did not).
"""

from __future__ import annotations

import shlex
from typing import Any

from hedgerow.client.names import visible

__all__ = ["failed_calls_lines", "failed_cell"]


def failed_cell(route: dict[str, Any]) -> str:
    """A route's failed calls of the recent window for the table: ``2.5% (3)``, ``0.0%``, ``-``
    without calls (or from an api that does not count them)."""
    calls, failed = route.get("recent_calls"), route.get("recent_failed_calls")
    if not calls or failed is None:
        return "-"
    return f"{failed / calls:.1%}" + (f" ({failed})" if failed else "")


def failed_calls_lines(data: dict[str, Any]) -> list[str]:
    """One line per route with failed calls in the window: how many, and the ``hedgerow routes
    calls`` command listing them (``--outcome failed`` over the same window; names shell-quoted,
    with control and format characters shown escaped)."""
    since, until = data.get("recent_since"), data.get("recent_until")
    if since is None or until is None:
        return []
    lines = []
    for route in data["routes"]:
        failed = route.get("recent_failed_calls")
        if not failed:
            continue
        command = shlex.join(
            ["hedgerow", "routes", "calls", route["route"], "--model", route["model"], "--outcome", "failed",
             "--since", since, "--until", until]
        )  # fmt: skip
        lines.append(
            f"{visible(route['route'])} · {visible(route['model'])}: {failed} failed call(s): {visible(command)}"
        )
    return lines
