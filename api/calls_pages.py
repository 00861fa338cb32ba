"""The calls explorer in the ops console: ``GET /ui/calls/{route}``, a route's recent calls.

``/ui/calls/{route}?model=&since=&until=&outcome=&winner=&upstream=&failed_upstream=&client=&cursor=``
lists the calls of (route, model), newest first, :data:`PAGE_CALLS` a page
(:func:`~hedgerow.controller.store.calls_query.recent_calls`); the filters are a GET form (the
upstream filters are selects of the upstreams of the route's newest calls,
the client filter a text field offering the page's clients, each call's client a link to the
calls of that client with the other filters kept), the next page a link carrying
the cursor. A URL with an empty parameter (what a form sends for a filter left at "any") is
redirected (303) to the same URL without it, so no link or address bar carries ``winner=``. Each call is a
``<details>`` element: its summary line (time, outcome, winning upstream, TTFT, e2e), and
opened, its attempts (upstream, role, start, TTFT, how it ended, status, error, tokens). Above
the list, the page's attempts are counted by upstream and outcome, so the upstream behind a
spike of failovers or hedges shows without opening a call.

The route's page links here: each history row to the calls of its tick's window
(:func:`tick_calls_url`), each point of its P99 and hedge-rate charts to the calls started since
the point before (:func:`calls_links`), each point of its failed-call chart to the failed calls of
its slot (see :func:`hedgerow.api._route_charts.route_charts`). Times in the links and the form are
UTC without a zone
(what a ``datetime-local`` input gives); a time with a zone is taken too.

Raw calls are deleted after ``retention_s``: a window reaching further back says so on the page.
Bad filters are a 422 page naming the parameter (the api's rule,
:func:`~hedgerow.controller.calls_filters.calls_filter_error`).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from hedgerow.api._page_kit import (
    error_page,
    form_time,
    page_user,
    render_page,
    route_url,
    templates,
    without_empty_params,
)
from hedgerow.api._state import app_state
from hedgerow.api.charts import PointLink
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.client.records import control_character_error
from hedgerow.controller.calls_filters import (
    CALL_OUTCOMES,
    DEFAULT_CALLS_LIMIT,
    MAX_SCAN_CALLS,
    calls_filter_error,
    decode_cursor,
)
from hedgerow.controller.errors import AmbiguousModel, UnknownRoute
from hedgerow.controller.store.calls_query import recent_calls, retention_note, route_upstreams
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.queries import resolve_model

__all__ = ["PAGE_CALLS", "calls_links", "calls_url", "router", "tick_calls_url"]

router = APIRouter(prefix="/ui/calls", include_in_schema=False)

#: Calls a page of the console shows.
PAGE_CALLS = DEFAULT_CALLS_LIMIT
#: How each outcome reads on the page.
OUTCOME_LABELS: dict[str, str] = {
    "primary_won": "primary won",
    "hedge_won": "hedge won",
    "failover": "failover",
    "failed": "failed",
    "cancelled": "cancelled",
}


def _link_time(moment: datetime) -> str:
    """A time as the console's links and ``datetime-local`` inputs carry it: UTC, no zone, seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def calls_url(route: str, model: str | None = None, **query: Any) -> str:
    """The console URL of a route's calls: ``/ui/calls/<route, quoted>`` with ``model`` and the
    non-empty ``query`` items (datetimes written as UTC without a zone)."""
    values = {"model": model} | query
    params = {k: _link_time(v) if isinstance(v, datetime) else v for k, v in values.items() if v not in (None, "")}
    suffix = f"?{urlencode(params)}" if params else ""
    return f"/ui/calls/{quote(route, safe='')}{suffix}"


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def tick_calls_url(route: str, model: str, row: dict[str, Any]) -> str | None:
    """The calls behind one threshold-history row: those started in the window its tick measured.

    Args:
        route, model: the route.
        row: a history row (:data:`~hedgerow.controller.store.queries.HISTORY_FIELDS`).

    Returns:
        The URL of the calls started from ``computed_at - window_s`` to ``last_at`` (every tick the
        row stands for), or None for a row without a window (a manual change).
    """
    if not row.get("window_s"):
        return None
    try:
        since = _iso(row["computed_at"]) - timedelta(seconds=float(row["window_s"]))
    except OverflowError:
        return None
    return calls_url(route, model, since=since, until=_iso(row["last_at"]))


templates.env.globals.update(calls_url=calls_url, tick_calls_url=tick_calls_url)


def _upstream_counts(calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    """The page's attempts per upstream and outcome (``won``, ``failed``, ``cancelled``), the
    upstream with the most failed attempts first."""
    counts: dict[str, Counter[str]] = {}
    for call in calls:
        for attempt in call["attempts"]:
            counts.setdefault(attempt["upstream"], Counter())[attempt["outcome"]] += 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1]["failed"], -sum(item[1].values()), item[0]))
    return [(name, {k: c[k] for k in ("won", "failed", "cancelled")}) for name, c in ordered]


@router.get("/{route:path}", response_class=HTMLResponse)
async def calls_page(request: Request, route: str) -> Response:
    """A route's recent calls, filtered and paged, each expandable to its attempts."""
    user = page_user(request)
    q = request.query_params
    model = q.get("model") or None
    outcome = q.get("outcome", "").strip() or None
    winner = q.get("winner", "").strip() or None
    upstream = q.get("upstream", "").strip() or None
    failed_upstream = q.get("failed_upstream", "").strip() or None
    client = q.get("client", "").strip() or None
    cursor = q.get("cursor", "").strip() or None
    emptied = without_empty_params(request, partial(calls_url, route))
    if emptied is not None:
        return emptied
    back = (route_url(route, model), "route")
    names = (("winner", winner), ("upstream", upstream), ("failed_upstream", failed_upstream))
    checked = (("route", route), ("model", model or ""), *((n, v or "") for n, v in (*names, ("client", client))))
    for name, value in checked:
        problem = control_character_error(value)
        if problem is None and len(value) > MAX_NAME_CHARS:  # the api's rule: 422, not an empty page
            problem = f"at most {MAX_NAME_CHARS} characters, got {len(value)}"
        if problem is not None:
            return error_page(request, user, 422, f"{name}: {problem}")
    try:
        since = form_time(q.get("since"), "since")
        until = form_time(q.get("until"), "until")
        after = None if cursor is None else decode_cursor(cursor)
    except ValueError as exc:
        message = str(exc) if str(exc).startswith(("since", "until")) else f"cursor: {exc}"
        return error_page(request, user, 422, message, back=back)
    refused = calls_filter_error(outcome=outcome, since=since, until=until)
    if refused is not None:
        return error_page(request, user, 422, f"{refused[0]}: {refused[1]}", back=back)
    try:
        async with app_state(request.app).sessionmaker() as session:
            chosen = await resolve_model(session, route, model)
            page = await recent_calls(
                session,
                route,
                chosen,
                limit=PAGE_CALLS,
                after=after,
                since=since,
                until=until,
                outcome=outcome,
                winner=winner,
                upstream=upstream,
                failed_upstream=failed_upstream,
                client=client,
            )
            choices = await route_upstreams(session, route, chosen)
    except UnknownRoute as exc:
        return error_page(request, user, 404, str(exc))
    except AmbiguousModel as exc:
        links = [(m, calls_url(route, m, **{k: v for k, v in q.items() if k != "model"})) for m in exc.models]
        return render_page(request, "pick_model.html", user, 200, title=route, route=route, links=links)
    filters = {
        "since": "" if since is None else _link_time(since),
        "until": "" if until is None else _link_time(until),
        "outcome": outcome or "",
        "winner": winner or "",
        "upstream": upstream or "",
        "failed_upstream": failed_upstream or "",
        "client": client or "",
    }
    asked = {value for _name, value in names if value is not None}
    return render_page(
        request,
        "calls.html",
        user,
        title=f"Calls · {route} · {chosen}",
        route=route,
        model=chosen,
        calls=page.calls,
        upstreams=_upstream_counts(page.calls),
        upstream_choices=sorted(set(choices) | asked),
        client_choices=sorted({c["client"] for c in page.calls if c["client"]}),
        filters=filters,
        outcomes=OUTCOME_LABELS,
        outcome_meanings=CALL_OUTCOMES,
        first_page=cursor is None,
        first_url=calls_url(route, chosen, **filters),
        next_url=None if page.next_cursor is None else calls_url(route, chosen, **filters, cursor=page.next_cursor),
        note=retention_note(since, utc_now(), app_state(request.app).settings.retention_s),
        scan_stopped_at=page.scan_stopped_at,
        max_scan=MAX_SCAN_CALLS,
    )


def calls_links(
    route: str, model: str, measured: list[dict[str, Any]], min_window_s: float
) -> tuple[list[PointLink], list[PointLink]]:
    """The chart points of a route's page that link to the calls behind them.

    A point is a tick's figure over its whole window (up to 24 h on a young route), but what moved
    it since the point before is the calls started in between: a point links to the calls started
    from the previous point (``last_at`` of the row before) to its own ``last_at``, widened to at
    least ``min_window_s`` before it and cut to the row's window; not to its tick's whole window
    as a history row does (:func:`tick_calls_url`). With a tick a minute that is the short window
    before the point; with an hourly tick, the hour.

    Args:
        route, model: the route.
        measured: its history rows the controller measured (oldest first), as the charts draw
            them: each row's P99 and hedge rate at its ``last_at``.
        min_window_s: the shortest span before a point whose calls it links to, seconds (the
            route page passes the short window, ``short_window_s``); also the span of the first
            point, which has none before it.

    Returns:
        ``(quantile_links, hedge_rate_links)``: a :class:`~hedgerow.api.charts.PointLink` per row
        with a window, at its P99 (its P90 when the P99 is unknown) and at its hedge rate.
    """
    p99: list[PointLink] = []
    rate: list[PointLink] = []
    previous: datetime | None = None
    for row in measured:
        at = _iso(row["last_at"])
        since_previous_s = min_window_s if previous is None else (at - previous).total_seconds()
        previous = at
        if not row.get("window_s"):
            continue  # a manual change: no window measured
        span_s = min(max(since_previous_s, min_window_s), float(row["window_s"]))
        try:
            href = calls_url(route, model, since=at - timedelta(seconds=span_s), until=at)
        except OverflowError:
            continue
        when = f"{at:%Y-%m-%d %H:%M} UTC"
        quantile = next((q for q in ("p99", "p90") if row.get(f"{q}_s") is not None), None)
        if quantile is not None:  # P99, else P90 where the censored calls leave P99 unknown
            value = row[f"{quantile}_s"]
            label = f"{quantile.upper()} {value:.3g} s at {when}: the calls since the point before"
            p99.append(PointLink(at, value, href, label, f"s-{quantile}"))
        if row.get("observed_hedge_rate") is not None:
            label = f"hedge rate {row['observed_hedge_rate'] * 100:.3g}% at {when}: the calls since the point before"
            rate.append(PointLink(at, row["observed_hedge_rate"], href, label, "s-rate"))
    return p99, rate
