"""The ops console: server-rendered pages under ``/ui/`` (Jinja2 templates, local CSS, no script).

Pages:

- ``GET /ui/`` and ``GET /ui/routes``: every route at a glance (published ``hedge_after_s``, its
  source, budget, last hour's hedge rate and backup win rate, flags, last change);
- ``GET /ui/routes/{route}?model=&range=``: one route: step chart of the published threshold with
  the primary's P90/P99 and a P90 line per upstream (the busiest six,
  :func:`~hedgerow.controller.store.upstream_series.upstream_ttft_series`) (log y axis), chart of the
  hedge rate against the budget (a line over a shaded band: the share allowed), over ``range`` (``1h``,
  ``6h``, ``24h``, ``7d``, ``30d``; a route whose history starts inside the range gets charts fitted
  to its data, with a note saying so); the history table (filters ``applied``, ``reason``, ``since``,
  ``until`` in UTC; 50 rows a page, ``page=``; each row expands, without script, to its
  plain-English sentences, :func:`~hedgerow.controller.policy.explain.explain_history_row`); the
  configuration, and with the admin scope a form;
  a ``range``, ``page``, ``applied``, ``reason``, ``since`` or ``until`` it cannot honour (an unknown
  reason code, ``since`` after ``until``: the api's rule, :func:`~hedgerow.controller.ops_bounds.history_filter_error`)
  is a 422 page naming it;
- ``POST /ui/routes/{route}?model=``: the form's change (admin), applied and audited like
  ``PATCH /v1/routes`` (:func:`hedgerow.controller.routes_admin.configure_route`), then back to
  the route's page (303); with ``action=archive`` the "Archive route" button: a confirmation page,
  then (``confirm=yes``) the archive, audited like ``DELETE /v1/routes``; ``action=restore`` undoes
  it;
- ``GET``/``POST /ui/login`` and ``POST /ui/logout``: with ``HEDGEROW_TOKENS`` set, pages need a
  token with the ``read`` (or ``admin``) scope, entered once on the login page and kept in the
  HttpOnly, SameSite=Strict cookie :data:`~hedgerow.api.auth.TOKEN_COOKIE`. A form post whose
  ``Origin`` is another site is refused (403).

Charts are inline SVG laid out by :mod:`hedgerow.api.charts` (a route's two: :mod:`hedgerow.api._route_charts`);
styles are ``/ui/static/hedgerow.css``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from hedgerow.api import route_changes
from hedgerow.api._page_kit import (
    STATIC_DIR,
    LoginNeeded,
    PageUser,
    error_page,
    form_time,
    page_user,
    render_page,
    route_url,
    without_empty_params,
)
from hedgerow.api._route_charts import chart_start, route_charts
from hedgerow.api._state import app_state
from hedgerow.api.auth import TOKEN_COOKIE, token_actor, token_scopes
from hedgerow.api.calls_pages import calls_url
from hedgerow.api.metrics import metrics_response
from hedgerow.client.records import control_character_error
from hedgerow.controller.errors import AmbiguousModel, RouteLimitExceeded, UnknownRoute
from hedgerow.controller.ops_bounds import budget_range_error, history_filter_error, parse_budget
from hedgerow.controller.policy.explain import explain_history_row
from hedgerow.controller.policy.reason_codes import REASON_CODES as POLICY_REASON_CODES
from hedgerow.controller.policy.reason_codes import SOURCE_MEANINGS, reason_legend
from hedgerow.controller.routes_admin import RouteConfigInvalid
from hedgerow.controller.store.call_failures import failed_calls_by_route, failure_series
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.overview import flags_of, history_series, route_overview
from hedgerow.controller.store.queries import get_history, get_route, resolve_model
from hedgerow.controller.store.upstream_series import upstream_ttft_series

__all__ = ["HISTORY_PAGE_ROWS", "MAX_HISTORY_PAGE", "RANGES", "PageUser", "install_pages", "router"]

router = APIRouter(prefix="/ui", include_in_schema=False)

#: The chart ranges a route's page offers, seconds.
RANGES: dict[str, float] = {"1h": 3600.0, "6h": 21_600.0, "24h": 86_400.0, "7d": 604_800.0, "30d": 2_592_000.0}
#: The last page number the history table takes (beyond it the offset would not fit SQLite's
#: or PostgreSQL's integers, and no route keeps that much history).
MAX_HISTORY_PAGE = 1_000_000
#: History rows per page of the table.
HISTORY_PAGE_ROWS = 50
#: Reason codes offered by the history filter: every code the policy writes (the only ones the
#: filter takes, as in the api).
REASON_CODES: tuple[str, ...] = tuple(sorted(POLICY_REASON_CODES))
_FORM_BYTES = 4096
#: The routes list's recent window, seconds (its hedge rate, backup wins, calls and failures).
RECENT_S = 3600.0


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
async def home() -> RedirectResponse:
    """The console's start page: the routes overview."""
    return RedirectResponse("/ui/routes", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/metrics")
async def metrics_page(request: Request) -> Response:
    """``/metrics`` for a browser: the same Prometheus text, authorized by the console's login cookie.

    (The cookie's path is ``/ui``, so a browser never sends it to ``/metrics``, which takes a
    bearer token; a scraper keeps using ``/metrics``.)
    """
    page_user(request)
    return await metrics_response(request)


@router.get("/routes", response_class=HTMLResponse)
async def routes_page(request: Request) -> HTMLResponse:
    """Every route at a glance."""
    user = page_user(request)
    async with app_state(request.app).sessionmaker() as session:
        now = utc_now()
        rows = await route_overview(session, now)
        failures = await failed_calls_by_route(session, now - timedelta(seconds=RECENT_S), now)
    for row in rows:
        failed = failures.get((row["route"], row["model"]), (0, 0))[1]
        row["recent_failed_calls"] = failed
        row["recent_failed_rate"] = failed / row["recent_calls"] if row["recent_calls"] else None
        row["failed_calls_url"] = calls_url(
            row["route"], row["model"], outcome="failed", since=now - timedelta(seconds=RECENT_S), until=now
        )
    return render_page(request, "routes.html", user, title="Routes", rows=rows)


#: Seconds a route's page reuses the per-upstream lines it read (paging or filtering the history
#: draws the same charts again): reading them visits every attempt of the range, about a second
#: for 100,000 calls a day; the lines are at most this old.
UPSTREAM_LINES_TTL_S = 60.0
#: Most routes' lines kept (least recently used dropped first).
UPSTREAM_LINES_CACHED = 64


async def _upstream_series(
    request: Request, session: Any, route: str, model: str, range_key: str, since: datetime, until: datetime
) -> dict[str, Any]:
    """``{"lines": upstream_ttft_series(...), "failures": failure_series(...)}`` of the route over
    ``[since, until]``, or the answer read for the same route, model and range less than
    :data:`UPSTREAM_LINES_TTL_S` ago (kept per app, at most :data:`UPSTREAM_LINES_CACHED`)."""
    state = app_state(request.app)
    cache: OrderedDict[tuple[str, str, str], tuple[float, dict[str, Any]]] | None = getattr(
        state, "upstream_lines_cache", None
    )
    if cache is None:
        cache = state.upstream_lines_cache = OrderedDict()
    key = (route, model, range_key)
    kept = cache.get(key)
    if kept is not None and time.monotonic() - kept[0] < UPSTREAM_LINES_TTL_S:
        cache.move_to_end(key)
        return kept[1]
    found = {
        "lines": await upstream_ttft_series(session, route=route, model=model, since=since, until=until),
        "failures": await failure_series(session, route=route, model=model, since=since, until=until),
    }
    cache[key] = (time.monotonic(), found)
    cache.move_to_end(key)
    while len(cache) > UPSTREAM_LINES_CACHED:
        cache.popitem(last=False)
    return found


async def _route_page(
    request: Request,
    user: PageUser,
    route: str,
    model: str | None,
    *,
    code: int = 200,
    form_error: dict[str, str] | None = None,
    form_values: dict[str, str] | None = None,
) -> HTMLResponse:
    q = request.query_params
    range_key = q.get("range") or "24h"
    if range_key not in RANGES:
        return error_page(request, user, 422, f"range: must be one of {', '.join(RANGES)}, got {range_key!r}")
    applied_text = q.get("applied", "")
    if applied_text not in ("", "true", "false"):
        return error_page(request, user, 422, f"applied: must be true, false or empty, got {applied_text!r}")
    applied = {"true": True, "false": False}.get(applied_text)
    reason = q.get("reason", "").strip() or None
    page_text = q.get("page", "").strip() or "1"
    # a page past MAX_HISTORY_PAGE would overflow the store's integers in its offset
    if not page_text.isdecimal() or not 1 <= int(page_text) <= MAX_HISTORY_PAGE:
        return error_page(request, user, 422, f"page: must be from 1 to {MAX_HISTORY_PAGE}, got {page_text!r}")
    page = int(page_text)
    for name, value in (("route", route), ("model", model or ""), ("reason", reason or "")):
        problem = control_character_error(value)
        if problem is not None:
            return error_page(request, user, 422, f"{name}: {problem}")
    try:
        since_filter = form_time(q.get("since"), "since")
        until_filter = form_time(q.get("until"), "until")
    except ValueError as exc:
        return error_page(request, user, 422, str(exc))
    refused = history_filter_error(reason=reason, since=since_filter, until=until_filter)
    if refused is not None:  # the api's rule: a filter that can only give an empty table is refused
        return error_page(request, user, 422, f"{refused[0]}: {refused[1]}", back=(route_url(route, model), "route"))
    now = utc_now()
    since = now - timedelta(seconds=RANGES[range_key])
    try:
        async with app_state(request.app).sessionmaker() as session:
            chosen = await resolve_model(session, route, model)
            config = await get_route(session, route, chosen)
            series = await history_series(session, route, chosen, since, now)
            chart_from, chart_note = chart_start(series, since, now, range_key)
            read = await _upstream_series(request, session, route, chosen, range_key, chart_from, now)
            rows = await get_history(
                session,
                route,
                chosen,
                limit=HISTORY_PAGE_ROWS + 1,
                offset=(page - 1) * HISTORY_PAGE_ROWS,
                since=since_filter,
                until=until_filter,
                applied=applied,
                reason=reason,
            )
    except UnknownRoute as exc:
        return error_page(request, user, 404, str(exc))
    except AmbiguousModel as exc:
        links = [(m, route_url(route, m)) for m in exc.models]
        return render_page(request, "pick_model.html", user, 200, title=route, route=route, links=links)
    filters = {
        "range": range_key,
        "applied": applied_text if applied is not None else "",
        "reason": reason or "",
        "since": q.get("since", ""),
        "until": q.get("until", ""),
    }
    current = {
        "budget": f"{config['budget']:g}",
        "default_hedge_after_s": f"{config['default_hedge_after_s']:g}",
        "min_hedge_after_s": f"{config['min_hedge_after_s']:g}",
        "max_hedge_after_s": f"{config['max_hedge_after_s']:g}",
        "pinned_hedge_after_s": "" if config["pinned_hedge_after_s"] is None else f"{config['pinned_hedge_after_s']:g}",
        "enabled": "on" if config["enabled"] else "",
    }
    return render_page(
        request,
        "route.html",
        user,
        code,
        title=f"{route} · {chosen}",
        route=config,
        model=chosen,
        charts=route_charts(
            series,
            config,
            chart_from,
            now,
            chart_note,
            read["lines"],
            read["failures"],
            app_state(request.app).settings.short_window_s,
        ),
        ranges=list(RANGES),
        rows=[
            row | {"flags": flags_of(row["reason"]), "explanation": explain_history_row(row)}
            for row in rows[:HISTORY_PAGE_ROWS]
        ],
        legend=reason_legend(row["reason"] for row in rows[:HISTORY_PAGE_ROWS]),
        page=page,
        more=len(rows) > HISTORY_PAGE_ROWS,
        filters=filters,
        reason_codes=REASON_CODES,
        source_meanings=SOURCE_MEANINGS,
        form=form_values or current,
        form_error=form_error,
        changed=q.get("changed", ""),
        page_url=lambda **changes: route_url(route, chosen, **(filters | {"page": page} | changes)),
    )


@router.get("/routes/{route:path}", response_class=HTMLResponse)
async def route_page(request: Request, route: str, model: str | None = None) -> Response:
    """One route: charts, history table, configuration and (admin) the change form; a URL with an
    empty filter (the history form left at "any") is answered with a 303 to it without them."""
    user = page_user(request)
    emptied = without_empty_params(request, partial(route_url, route))
    if emptied is not None:
        return emptied
    return await _route_page(request, user, route, model or None)


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _form_fields(form: dict[str, str]) -> dict[str, Any]:
    """The route settings of the change form; the budget may be a fraction (0.05) or a percent (5%).

    Raises:
        RouteConfigInvalid: a number that is not one (``field`` names the form's field).
    """
    fields: dict[str, Any] = {"enabled": form.get("enabled") == "on"}
    for name in ("budget", "default_hedge_after_s", "min_hedge_after_s", "max_hedge_after_s", "pinned_hedge_after_s"):
        text = form.get(name, "").strip()
        if not text:
            if name == "pinned_hedge_after_s":
                fields[name] = None
                continue
            raise RouteConfigInvalid(name, "required")
        try:  # the console shows budgets as percent: "5%" is taken like 0.05
            value = parse_budget(text) if name == "budget" else float(text)
        except ValueError as exc:
            message = str(exc) if name == "budget" else f"not a number: {text!r}"
            raise RouteConfigInvalid(name, message) from None
        if not math.isfinite(value):
            raise RouteConfigInvalid(name, f"must be finite, got {text!r}")
        out_of_range = budget_range_error(value, text) if name == "budget" else None
        if out_of_range is not None:  # quoted as typed ("150%"), not as the fraction it gives
            raise RouteConfigInvalid(name, out_of_range)
        fields[name] = value
    return fields


@router.post("/routes/{route:path}", response_class=HTMLResponse)
async def change_route(request: Request, route: str, model: str | None = None) -> Response:
    """Apply the change form (admin scope), then show the route's page again (303)."""
    user = page_user(request)
    if not user.admin:
        return error_page(request, user, 403, "changing a route needs a token with the admin scope")
    if not _same_origin(request):
        return error_page(request, user, 403, "form posted from another site")
    raw = await request.body()
    if len(raw) > _FORM_BYTES:
        return error_page(request, user, 413, f"form of {len(raw)} bytes exceeds {_FORM_BYTES} bytes")
    form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).items()}
    if not model:
        return error_page(request, user, 422, "model: required")
    state = app_state(request.app)
    actor = "ui" if user.token is None else token_actor(state.tokens, state.token_names, user.token)
    if form.get("action") in ("archive", "restore"):
        return await _archive_form(request, user, route, model, form, actor)
    try:
        fields = _form_fields(form)
        result = await route_changes.change_settings(state, route, model, fields, replace=False, actor=actor)
    except RouteConfigInvalid as exc:
        return await _route_page(
            request,
            user,
            route,
            model,
            code=422,
            form_error={"field": exc.field, "message": exc.message},
            form_values=form,
        )
    except UnknownRoute as exc:
        return error_page(request, user, 404, str(exc))
    except ValueError as exc:
        return error_page(request, user, 422, str(exc))
    changed = ",".join(sorted(result.changes)) or "nothing"
    return RedirectResponse(route_url(route, model, changed=changed) + "#change", status_code=status.HTTP_303_SEE_OTHER)


async def _archive_form(
    request: Request, user: PageUser, route: str, model: str, form: dict[str, str], actor: str
) -> Response:
    """The route page's archive and restore buttons (admin; same origin, checked by the caller).

    ``action=archive`` without ``confirm=yes`` answers the confirmation page; with it the route is
    archived (:func:`~hedgerow.controller.routes_admin.archive_route`). ``action=restore``
    restores it. Both go back to the route's page (303).
    """
    state = app_state(request.app)
    try:
        if form.get("action") == "restore":
            await route_changes.restore(state, route, model, actor=actor)
            done = "restored"
        elif form.get("confirm") != "yes":
            async with state.sessionmaker() as session:
                config = await get_route(session, route, model)
            if config["archived_at"] is not None:
                return RedirectResponse(route_url(route, model) + "#archive", status_code=status.HTTP_303_SEE_OTHER)
            title = f"Archive {route}"
            return render_page(request, "archive_confirm.html", user, title=title, route=route, model=model)
        else:
            await route_changes.archive(state, route, model, actor=actor)
            done = "archived"
    except UnknownRoute as exc:
        return error_page(request, user, 404, str(exc))
    except RouteLimitExceeded as exc:
        return error_page(request, user, 422, str(exc), back=(route_url(route, model), "route"))
    except ValueError as exc:
        return error_page(request, user, 422, str(exc))
    return RedirectResponse(route_url(route, model, changed=done) + "#archive", status_code=status.HTTP_303_SEE_OTHER)


def _safe_next(target: str | None) -> str:
    """Only a path of the console itself (no other host, no scheme) is a place to go back to."""
    if target and target.startswith("/ui/") and not target.startswith("//"):
        return target
    return "/ui/routes"


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    """The token form (or a note that no tokens are configured)."""
    return render_page(
        request,
        "login.html",
        None,
        title="Log in",
        next=_safe_next(next),
        auth=bool(app_state(request.app).tokens),
        error=None,
    )


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the token; keep it in the HttpOnly cookie and go back to the page asked for."""
    raw = await request.body()
    form = {k: v[-1] for k, v in parse_qs(raw[:_FORM_BYTES].decode("utf-8", "replace")).items()}
    target = _safe_next(form.get("next"))
    token = form.get("token", "").strip()
    scopes = token_scopes(app_state(request.app).tokens, token)
    if scopes is None or not scopes & {"read", "admin"}:
        message = "unknown token" if scopes is None else "this token lacks the read scope"
        return render_page(
            request,
            "login.html",
            None,
            401,
            title="Log in",
            next=target,
            auth=bool(app_state(request.app).tokens),
            error=message,
        )
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        path="/ui",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> RedirectResponse:
    """Forget the token cookie."""
    response = RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(TOKEN_COOKIE, path="/ui")
    return response


def install_pages(app: FastAPI) -> None:
    """Add the console's pages, its static files (``/ui/static``) and the login redirect to ``app``."""
    from hedgerow.api import calls_pages, report_pages, upstream_pages

    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    app.include_router(router)
    app.include_router(report_pages.router)
    app.include_router(upstream_pages.router)
    app.include_router(calls_pages.router)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """The service's root opens the console (a browser pointed at the service finds it)."""
        return RedirectResponse("/ui/routes", status_code=status.HTTP_303_SEE_OTHER)

    @app.exception_handler(LoginNeeded)
    async def login_needed(_request: Request, exc: LoginNeeded) -> RedirectResponse:
        return RedirectResponse(f"/ui/login?{urlencode({'next': exc.next_url})}", status_code=status.HTTP_303_SEE_OTHER)
