"""The per-upstream page of the ops console: ``GET /ui/upstreams?range=&route=``.

One table, a row per upstream, over the calls started in the last ``range`` (``1h``, ``6h``,
``24h`` (default), ``7d``, ``30d``), of every route or of ``route``: attempts, TTFT P50/P90/P99
(Kaplan-Meier, censored attempts counted), error/timeout/stall rates, win rate in races, hedges
caused and loser tokens; the figures of ``GET /v1/upstreams``
(:func:`hedgerow.controller.store.upstreams.upstream_stats`). Each row links to the upstream's
calls in the calls explorer over the same window, per route it served (the busiest three,
:func:`~hedgerow.controller.store.upstreams.upstream_routes`), and to those where an attempt on it
failed. A ``range`` it does not offer or a
``route`` with a control character is a 422 page naming it, an unknown route a 404 page. Like
every console page it needs the ``read`` scope when tokens are configured.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from hedgerow.api._page_kit import error_page, page_user, render_page
from hedgerow.api._state import app_state
from hedgerow.api.calls_pages import calls_url
from hedgerow.client.records import control_character_error
from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.upstreams import coverage_note, upstream_routes, upstream_stats

__all__ = ["RANGES", "router", "upstreams_url"]

router = APIRouter(prefix="/ui/upstreams", include_in_schema=False)

#: The windows the page offers, seconds (all within the store's 32-day cap).
RANGES: dict[str, float] = {"1h": 3600.0, "6h": 21_600.0, "24h": 86_400.0, "7d": 604_800.0, "30d": 2_592_000.0}


def upstreams_url(route: str | None = None, range_key: str | None = None) -> str:
    """The console URL of the upstreams page, of one route and range when given."""
    params = {k: v for k, v in {"route": route, "range": range_key}.items() if v}
    return "/ui/upstreams" + (f"?{urlencode(params)}" if params else "")


def _quantile(entry: dict[str, Any] | None) -> str:
    """A TTFT quantile as the table shows it: ``0.412 s``, ``≥ 2.5 s`` when only bounded below."""
    if entry is None:
        return "-"
    if entry["value_s"] is None:
        return f"≥ {entry['low_s']:.3g} s"
    return f"{entry['value_s']:.3f} s"


def _calls_links(
    upstream: str, routes: list[tuple[str, str, int]], since: datetime, until: datetime
) -> list[tuple[str, str, str | None]]:
    """Links to an upstream's calls over the page's window in each route it served: ``(label,
    URL of the calls with an attempt on it, URL of those where one failed)``."""
    return [
        (
            f"{route} · {model}",
            calls_url(route, model, upstream=upstream, since=since, until=until),
            calls_url(route, model, failed_upstream=upstream, since=since, until=until),
        )
        for route, model, _attempts in routes
    ]


@router.get("", response_class=HTMLResponse)
async def upstreams_page(request: Request) -> HTMLResponse:
    """Every upstream's figures over the chosen range, of every route or of one."""
    user = page_user(request)
    q = request.query_params
    range_key = q.get("range") or "24h"
    if range_key not in RANGES:
        return error_page(request, user, 422, f"range: must be one of {', '.join(RANGES)}, got {range_key!r}")
    route = q.get("route") or None
    if route is not None:
        problem = control_character_error(route)
        if problem is not None:
            return error_page(request, user, 422, f"route: {problem}")
    now = utc_now()
    since = now - timedelta(seconds=RANGES[range_key])
    try:
        async with app_state(request.app).sessionmaker() as session:
            table = await upstream_stats(session, since=since, until=now, route=route)
            names = [row["upstream"] for row in table["upstreams"]]
            routes = await upstream_routes(session, since=since, until=now, upstreams=names, route=route)
    except UnknownRoute as exc:
        return error_page(request, user, 404, str(exc), back=("/ui/upstreams", "upstreams"))
    # raw calls older than the retention are deleted: say so when the range reaches past it
    kept_from = now - timedelta(seconds=app_state(request.app).settings.retention_s)
    return render_page(
        request,
        "upstreams.html",
        user,
        title="Upstreams" + (f" · {route}" if route else ""),
        table=table,
        route=route,
        range_key=range_key,
        ranges=list(RANGES),
        kept_from=kept_from if kept_from > since else None,
        empty_note=coverage_note(since, now, table["covered_from"], len(table["upstreams"])),
        quantile=_quantile,
        upstreams_url=upstreams_url,
        calls_links={name: _calls_links(name, found, since, now) for name, found in routes.items()},
    )
