"""What every console page shares: the templates and their filters, the page's user, rendering.

The console's page modules (:mod:`hedgerow.api.pages`, :mod:`hedgerow.api.report_pages`) build
on these: :func:`page_user` reads the token cookie (raising :class:`LoginNeeded`, which
:func:`hedgerow.api.pages.install_pages` answers with a redirect to the login page),
:func:`render_page` renders a template with the user in its context, :func:`error_page` the
error template, and :func:`refusal_page` the error template for a request the body-limit
middleware refuses before it reaches the console (:mod:`hedgerow.api.limits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.types import Scope

from hedgerow import __version__
from hedgerow.api._state import app_state
from hedgerow.api.auth import TOKEN_COOKIE, token_scopes
from hedgerow.controller.policy.reason_codes import explain_reason

__all__ = [
    "STATIC_DIR",
    "LoginNeeded",
    "PageUser",
    "error_page",
    "form_time",
    "page_user",
    "refusal_page",
    "render_page",
    "route_url",
    "templates",
    "without_empty_params",
]

_HERE = Path(__file__).parent
#: The console's CSS and images, served under ``/ui/static``.
STATIC_DIR = _HERE / "static"
templates = Jinja2Templates(directory=_HERE / "templates")


@dataclass(frozen=True)
class PageUser:
    """Who looks at a page: ``scopes`` of the token (every scope without tokens), the token (None
    without tokens), and whether tokens are configured at all."""

    scopes: frozenset[str]
    token: str | None
    auth: bool

    @property
    def admin(self) -> bool:
        """True when the user may change routes."""
        return "admin" in self.scopes


class LoginNeeded(Exception):
    """Raised by :func:`page_user` when the page needs a (better) token; answered by a redirect.

    Attributes:
        next_url: the page to come back to after the login (path and query).
    """

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


def _seconds(value: float | None) -> str:
    """``1.25 s``-style text (3 significant decimals, trailing zeros cut), ``-`` for None."""
    if value is None or not math.isfinite(value):
        return "-"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


def _percent(value: float | None) -> str:
    """``12.5%``-style text, ``-`` for None."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 100:.1f}%"


def _when(value: str | None) -> str:
    """An ISO timestamp as ``2026-12-01 20:45:03`` (UTC), ``-`` for None."""
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def form_time(text: str | None, field: str) -> datetime | None:
    """A console filter's time: ISO 8601 with a zone, or without one (a ``datetime-local`` input) read
    as UTC; None for an empty or blank field.

    Args:
        text: the form's or query's value, as typed.
        field: the field's name, for the error message.

    Raises:
        ValueError: not a time, or outside the calendar in UTC; the message names ``field``.
    """
    if not text or not text.strip():
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{field}: not a time ({text!r}); use e.g. 2026-12-01T08:00 (UTC)") from None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+05:00: before year 1 in UTC
        raise ValueError(f"{field}: out of range ({text!r}); not within years 1..9999 in UTC") from None


def without_empty_params(request: Request, url: Callable[..., str]) -> RedirectResponse | None:
    """A 303 to the same page without its empty query parameters, or None when it has none.

    A filter form left at "any" sends ``winner=`` or ``since=``; the page answers the same URL
    without them, so no link or address bar carries an empty filter.

    Args:
        request: the page's request.
        url: the page's URL builder, ``url(**non_empty_query) -> str`` (``model`` included).
    """
    query = request.query_params
    if all(value.strip() for _name, value in query.multi_items()):
        return None
    kept = {name: value for name, value in query.items() if value.strip()}
    return RedirectResponse(url(**kept), status_code=303)


def route_url(route: str, model: str | None = None, **query: Any) -> str:
    """The console URL of a route's page: ``/ui/routes/<route, quoted>`` with ``model`` and the
    non-empty ``query`` items as its query string."""
    params = {k: v for k, v in ({"model": model} | query).items() if v not in (None, "")}
    suffix = f"?{urlencode(params)}" if params else ""
    return f"/ui/routes/{quote(route, safe='')}{suffix}"


templates.env.filters.update(seconds=_seconds, percent=_percent, when=_when, explain_reason=explain_reason)
templates.env.globals.update(route_url=route_url, version=__version__)


def page_user(request: Request) -> PageUser:
    """The page's user from the token cookie.

    Raises:
        LoginNeeded: tokens are configured and the cookie holds no token with ``read`` or ``admin``.
    """
    tokens: dict[str, frozenset[str]] = app_state(request.app).tokens
    if not tokens:
        return PageUser(frozenset({"ingest", "read", "admin"}), None, auth=False)
    given = request.cookies.get(TOKEN_COOKIE)
    scopes = token_scopes(tokens, given)
    if scopes is None or not scopes & {"read", "admin"}:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginNeeded(target)
    return PageUser(scopes, given, auth=True)


def render_page(request: Request, name: str, user: PageUser | None, code: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` rendered with ``user`` and ``context``, answered with status ``code``."""
    return templates.TemplateResponse(request, name, {"user": user, **context}, status_code=code)


def error_page(
    request: Request,
    user: PageUser | None,
    code: int,
    message: str,
    *,
    back: tuple[str, str] = ("/ui/routes", "routes"),
) -> HTMLResponse:
    """The error page with ``message`` (a sentence naming what was wrong), status ``code``, and a
    link back to ``back`` (``(path, what)``: "Back to the <what>"; default the routes)."""
    return render_page(request, "error.html", user, code, title="Error", message=message, back=back)


def refusal_page(scope: Scope, code: int, message: str) -> HTMLResponse:
    """The error page of a console request refused before it reached the console (a form body
    over its limit, too slow, or cut by a shutdown), with a link back to the page posted to.

    No user is looked up (the token cookie is not read): the page shows no log-out button.

    Args:
        scope: the ASGI scope of the request (a path under ``/ui/``).
        code: the HTTP status (413, 408, 503).
        message: the sentence naming what was wrong (``body of 70000 bytes exceeds the limit of
            65536 bytes``).

    Returns:
        The rendered page (status ``code``).
    """
    raw_path = scope.get("raw_path") or quote(scope.get("path", "")).encode()
    path = raw_path.decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    back = path + (f"?{query}" if query else "") if path.startswith("/ui/") else "/ui/routes"
    return error_page(Request(scope), None, code, message, back=(back, "page"))
