"""Refuse a request whose URL path holds a control character, naming the path parameter it is in.

Starlette matches a path against each route's regular expression, in which ``.`` does not match
a newline and ``$`` matches before a final one: ``/v1/routes/a%0Ab`` matches no route (a plain
404) and ``/v1/routes/a%0A`` matches route ``a``. No name the api stores may hold a control
character (:func:`hedgerow.client.records.control_character_error`), so
:class:`ControlCharacterPathMiddleware` answers every such request before routing:

- under ``/ui`` (the console): its HTML error page, 422, naming the parameter and the character;
- anywhere else: 422 ``{"detail": {"field": <parameter>, "message": ...}}``, the shape of every
  other bad value (``field`` is ``route`` for ``/v1/routes/...`` and ``/v1/thresholds/...``,
  ``model`` for ``/v1/prices/...``, ``path`` where no route's parameter holds the character).

The parameter is named from the path's prefix (:data:`PATH_PARAMETERS`, one entry per route with
a path parameter; ``tests/api/test_path_control_characters.py`` checks each). The answer comes
before the token check: it tells the caller only what was wrong with its own URL.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from hedgerow.api._page_kit import LoginNeeded, error_page, page_user
from hedgerow.api.json_body import unprocessable
from hedgerow.client.records import control_character_error

__all__ = ["CONSOLE_PREFIX", "PATH_PARAMETERS", "ControlCharacterPathMiddleware", "path_problem"]

#: The parameter a path's control character is reported in, by the path's prefix: ``(prefix,
#: parameter)``; the rest of the path after the prefix starts with that parameter's value (the
#: first of the route's path parameters; ``{route:path}`` may hold ``/``).
PATH_PARAMETERS: tuple[tuple[str, str], ...] = (
    ("/v1/routes/", "route"),
    ("/v1/thresholds/", "route"),
    ("/v1/prices/", "model"),
    ("/ui/routes/", "route"),
    ("/ui/reports/", "week"),
)
#: The console's pages (HTML answers) live under this path.
CONSOLE_PREFIX = "/ui"
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def path_problem(path: str) -> tuple[str, str] | None:
    """The parameter of ``path`` holding a control character and what is wrong, or None.

    Args:
        path: the request's decoded URL path.

    Returns:
        ``(field, message)``: ``field`` the path parameter the first control character is in
        (:data:`PATH_PARAMETERS`; ``path`` for any other path), ``message`` from
        :func:`~hedgerow.client.records.control_character_error` on the path after the
        parameter's prefix (so its index is counted in the name given); None when ``path`` holds
        no control character.
    """
    if _CONTROL.search(path) is None:
        return None
    for prefix, field in PATH_PARAMETERS:
        if path.startswith(prefix) and _CONTROL.search(path[len(prefix) :]):
            return field, control_character_error(path[len(prefix) :]) or ""
    return "path", control_character_error(path) or ""


class ControlCharacterPathMiddleware:
    """ASGI middleware: a request whose path holds a control character gets a 422 naming it.

    Args:
        app: the ASGI app wrapped (its ``scope["app"]`` is the FastAPI app, whose routes name the
            parameter and whose templates render the console's error page).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Answer a bad path at once; pass any other request (and non-HTTP scope) on."""
        if scope["type"] != "http" or _CONTROL.search(scope.get("path", "")) is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        path = scope["path"]
        field, message = path_problem(path) or ("path", "")
        response: Any
        if path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/"):
            try:
                user = page_user(request)
            except LoginNeeded:
                user = None  # the page names only what was wrong with the caller's own URL
            response = error_page(request, user, 422, f"{field}: {message}")
        else:
            response = unprocessable(field, message)
        await response(scope, receive, send)
