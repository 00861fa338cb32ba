"""Checks made on a request's head, before any of its body is read (ASGI middleware).

:class:`RequestGuardMiddleware` sits outside :class:`~hedgerow.api.limits.BodyLimitMiddleware`
and answers, in this order:

1. ``400`` (field ``host``) when the ``Host`` header names a host the server does not answer to
   (:class:`HostPolicy`): a page of another site whose name was re-pointed at this server (DNS
   rebinding) addresses it by that other name.
2. For a state-changing request (any method but GET, HEAD, OPTIONS): ``403`` (field ``origin``)
   when an ``Origin`` header is present and is neither this server's own origin (the request's
   scheme with its ``Host``) nor one of ``allowed_origins``; ``403`` (field ``sec-fetch-site``)
   when there is no ``Origin`` but the browser says ``Sec-Fetch-Site: cross-site``.
3. For a state-changing request to the JSON api (every path outside the console's ``/ui/``):
   ``415`` (field ``content-type``) unless it declares ``application/json`` or a ``+json`` type;
   a request with neither a body nor a ``Content-Type`` (``POST /v1/controller/run`` from the
   CLI) passes. A browser can send a cross-site ``text/plain`` or form post without asking
   first; a JSON one it cannot. The console's forms post form-encoded and stay allowed, guarded
   by 1 and 2.
4. With tokens configured, for a request that declares a body and whose endpoint requires a
   scope (:func:`hedgerow.api.auth.require_scope`): ``401``/``403`` (field ``authorization``) by
   :func:`hedgerow.api.auth.check_bearer`, the rule the endpoint itself applies, so a caller
   without a valid token never makes the server read (and buffer) its body.

Every answer is the api's error shape ``{"detail": {"field": ..., "message": ...}}`` with
``Connection: close`` (the body, if any, is never read).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import BaseRoute, Match

from hedgerow.api._state import app_state
from hedgerow.api.auth import ScopeDependency, check_bearer, is_loopback
from hedgerow.api.errors import ApiConfigError
from hedgerow.api.limits import Receive, Scope, Send, send_refusal

__all__ = ["HostPolicy", "RequestGuardMiddleware", "parse_origin", "route_scopes", "scoped_routes", "split_host"]

log = logging.getLogger(__name__)

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Bind addresses meaning "every interface": no address of their own for clients to use.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a ``Host`` header or an authority: lower-case, IPv6 without brackets.

    Args:
        value: ``name``, ``name:port``, ``1.2.3.4:port``, ``[::1]:port``.

    Returns:
        The host and the port (None when absent), or None for a value that is not an authority.
    """
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[1:end], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    else:
        host, sep, port_text = text.partition(":")
        rest = sep + port_text
        if ":" in port_text:  # an IPv6 address needs its brackets
            return None
    if not host or any(c.isspace() or c in "/\\@?#" for c in host):
        return None
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:].isdigit() or int(rest[1:]) > 65535:
        return None
    return host, int(rest[1:])


def parse_origin(value: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin (``https://ops.example:8443``), the port made explicit.

    Returns:
        None for ``null`` or anything that is not ``scheme://host[:port]``.
    """
    parts = urlsplit(value.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    authority = split_host(parts.netloc)
    if authority is None or "@" in parts.netloc:
        return None
    host, port = authority
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


class HostPolicy:
    """Which ``Host`` and ``Origin`` values the server answers to.

    Hosts: the loopback names (``localhost``, 127.0.0.0/8, ``::1``) with any port; the bind
    address ``bind_host`` when it is a concrete address; the names of ``allowed_hosts``
    (``*``: any host). When ``bind_host`` is a wildcard (``0.0.0.0``, ``::``) and
    ``allowed_hosts`` is empty, any host is answered (tokens are then required, and a page of
    another site, which has neither the token nor the console's cookie, gets 401); a warning
    says so at start.

    Args:
        bind_host: the address ``serve`` binds (``settings.host``).
        allowed_hosts: comma-separated host names or addresses, without ports (``*``: any).
        allowed_origins: comma-separated origins (``https://ops.example``) whose state-changing
            requests are accepted besides the server's own.

    Raises:
        ApiConfigError: an entry of ``allowed_hosts`` or ``allowed_origins`` that is not a host
            name or address / an origin (named, with its setting).
    """

    def __init__(self, bind_host: str, allowed_hosts: str = "", allowed_origins: str = "") -> None:
        names = _names(allowed_hosts)
        self.any_host = "*" in names
        self.hosts: set[str] = set()
        for name in names:
            if name == "*":
                continue
            parsed = split_host(name)
            if parsed is None or parsed[1] is not None:
                raise ApiConfigError(f"HEDGEROW_ALLOWED_HOSTS: {name!r} is not a host name or address (no port)")
            self.hosts.add(parsed[0])
        if bind_host.strip() in _WILDCARDS:
            if not names:
                self.any_host = True
                log.warning(
                    "listening on %r without HEDGEROW_ALLOWED_HOSTS: any Host header is answered "
                    "(set the names clients use to refuse the others)",
                    bind_host,
                )
        else:
            bound = split_host(bind_host if ":" not in bind_host or bind_host.startswith("[") else f"[{bind_host}]")
            if bound is not None:
                self.hosts.add(bound[0])
        self.origins: set[tuple[str, str, int]] = set()
        for origin in _names(allowed_origins):
            parsed_origin = parse_origin(origin)
            if parsed_origin is None:
                raise ApiConfigError(f"HEDGEROW_ALLOWED_ORIGINS: {origin!r} is not an origin (scheme://host[:port])")
            self.origins.add(parsed_origin)

    def host_allowed(self, host: str) -> bool:
        """True when the server answers to ``host`` (as :func:`split_host` gives it)."""
        return self.any_host or host in self.hosts or is_loopback(host)

    def origin_allowed(self, origin: str, scheme: str, host: str, port: int | None) -> bool:
        """True when ``origin`` is the request's own (``scheme``, its ``Host``) or an allowed one."""
        parsed = parse_origin(origin)
        if parsed is None:
            return False
        own = (scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme, 0))
        return parsed == own or parsed in self.origins


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _has_body(scope: Scope) -> bool:
    """True when the request declares a body (a non-zero ``Content-Length``, or chunked)."""
    length = _header(scope, b"content-length")
    if length is not None and length.strip() != "0":
        return True
    return _header(scope, b"transfer-encoding") is not None


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _scopes_of(dependant: Dependant) -> frozenset[str] | None:
    """The scopes wanted by the first :class:`~hedgerow.api.auth.ScopeDependency` in ``dependant``'s tree."""
    for sub in dependant.dependencies:
        if isinstance(sub.call, ScopeDependency):
            return sub.call.wanted
        found = _scopes_of(sub)
        if found is not None:
            return found
    return None


def scoped_routes(routes: Sequence[BaseRoute]) -> list[tuple[APIRoute, frozenset[str]]]:
    """The api routes of ``routes`` (included routers flattened) that require a scope, with it.

    Routers are included without a prefix of their own (as :func:`hedgerow.api.app.create_app`
    does), so each route's own path is the one requests match.
    """
    found: list[tuple[APIRoute, frozenset[str]]] = []
    for context in iter_route_contexts(routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            wanted = _scopes_of(route.dependant)
            if wanted is not None:
                found.append((route, wanted))
    return found


def route_scopes(routes: Iterable[tuple[APIRoute, frozenset[str]]], scope: Scope) -> frozenset[str] | None:
    """The scopes the endpoint of request ``scope`` requires, out of :func:`scoped_routes`, or None
    (no such route matches the path and method: the app answers 404/405, or checks nothing).
    """
    for route, wanted in routes:
        match, _child = route.matches(scope)
        if match is Match.FULL:
            return wanted
    return None


class RequestGuardMiddleware:
    """Refuse, from the request head alone, forged or unauthenticated requests (see the module docstring).

    Args:
        app: the ASGI app to protect.
        policy: the hosts and origins the server answers to.
    """

    def __init__(self, app: Any, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy
        self._scoped: list[tuple[APIRoute, frozenset[str]]] | None = None  # made on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request head; answer a refusal, or run the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            code, field, message, headers = refusal
            await send_refusal(send, code, field, message, headers)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str, list[tuple[bytes, bytes]]] | None:
        """``(status, field, message, extra headers)`` of the answer refusing the request, or None."""
        host_header = _header(scope, b"host")
        authority = split_host(host_header) if host_header is not None else None
        if authority is None:
            shown = "missing" if host_header is None else f"{host_header!r} is not a host"
            return 400, "host", f"host not allowed: Host header {shown}", []
        host, port = authority
        if not self.policy.host_allowed(host):
            return 400, "host", f"host not allowed: {host!r} (HEDGEROW_ALLOWED_HOSTS)", []
        method = scope["method"]
        if method in _SAFE_METHODS:
            return None
        origin = _header(scope, b"origin")
        if origin is not None:
            if not self.policy.origin_allowed(origin, scope.get("scheme", "http"), host, port):
                return (
                    403,
                    "origin",
                    f"cross-origin request refused: Origin {origin!r} is neither this server's nor in"
                    " HEDGEROW_ALLOWED_ORIGINS",
                    [],
                )
        elif (_header(scope, b"sec-fetch-site") or "").strip().lower() == "cross-site":
            return 403, "sec-fetch-site", "cross-site request refused (Sec-Fetch-Site: cross-site)", []
        path: str = scope["path"]
        has_body = _has_body(scope)
        if path != "/ui" and not path.startswith("/ui/"):
            content_type = _header(scope, b"content-type")
            if (content_type is not None or has_body) and not _is_json(content_type or ""):
                given = "none" if content_type is None else repr(content_type)
                return 415, "content-type", f"expected application/json (or a +json type), got {given}", []
        tokens = app_state(scope["app"]).tokens if "app" in scope else None
        if tokens and has_body:
            if self._scoped is None:  # the app's routes are all in place once it serves
                self._scoped = scoped_routes(scope["app"].router.routes)
            wanted = route_scopes(self._scoped, scope)
            if wanted is not None:
                try:
                    check_bearer(tokens, _header(scope, b"authorization") or "", wanted)
                except HTTPException as exc:
                    detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
                    headers = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
                    return exc.status_code, "authorization", str(detail.get("message", "")), headers
        return None
