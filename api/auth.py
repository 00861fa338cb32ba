"""Bearer-token auth with scopes, and named tokens for the audit trail.

``settings.tokens`` is ``[name=]token:scope+scope,...`` (e.g. ``alice=s3cret:admin,poller:ingest``).
Scopes: ``ingest`` (post calls, read thresholds), ``read`` (read everything), ``admin``
(everything), ``gateway`` (call through ``hedgerow gateway``, whose key it then is, named by the
entry's name; it opens nothing of the api). An entry's optional ``name=`` (letters, digits,
``_.-``, up to 64, starting with a letter) names the token's holder: the name is the audit
actor of the changes made with it (:func:`token_actor`); an unnamed token is recorded by its
fingerprint. A base64 token whose only ``=`` are its trailing padding is never taken for a name.
With no tokens configured every request is allowed, and the server refuses to listen on anything
but loopback (:func:`check_listen_allowed`).

A request carries its token as ``Authorization: Bearer <token>``; the pages under ``/ui/`` also
accept it from the HttpOnly cookie :data:`TOKEN_COOKIE` set by their login page. 401 and 403
answers have the documented body ``{"detail": {"field": "authorization", "message": ...}}``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hedgerow.api._state import app_state
from hedgerow.api.errors import ApiConfigError

__all__ = [
    "BEARER_SCHEME",
    "BEARER_SECURITY",
    "MIN_TOKEN_CHARS",
    "SCOPES",
    "TOKEN_COOKIE",
    "ScopeDependency",
    "authorize",
    "bearer_token",
    "check_bearer",
    "check_listen_allowed",
    "is_loopback",
    "parse_token_names",
    "parse_tokens",
    "require_scope",
    "token_actor",
    "token_scopes",
]

SCOPES: tuple[str, ...] = ("ingest", "read", "admin", "gateway")
#: The cookie holding the token of the pages' login (HttpOnly, SameSite=Strict, path /ui).
TOKEN_COOKIE = "hedgerow_token"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")

#: The bearer scheme, declared on every protected operation of the OpenAPI document (the header
#: itself is checked by :func:`require_scope`; ``auto_error=False``: a missing token is its 401).
BEARER_SCHEME = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description=(
        "A token of HEDGEROW_TOKENS (token:scope+scope,...); scopes ingest, read and admin (admin is "
        "accepted everywhere). Without configured tokens (loopback only) no token is needed."
    ),
)

#: The OpenAPI ``security`` of an operation that checks :data:`BEARER_SCHEME` inline (:func:`authorize`).
BEARER_SECURITY: list[dict[str, list[str]]] = [{BEARER_SCHEME.scheme_name: []}]


def _entries(text: str) -> list[tuple[str | None, str, frozenset[str]]]:
    """``(name, token, scopes)`` of each entry of ``text``.

    Raises:
        ApiConfigError: an entry without ``:``, an empty token, no scope, or an unknown scope.
    """
    entries: list[tuple[str | None, str, frozenset[str]]] = []
    for position, entry in enumerate(part.strip() for part in text.split(",")):
        if not entry:
            continue
        token, sep, scopes_text = entry.rpartition(":")
        if not sep or not token:
            raise ApiConfigError(
                f"HEDGEROW_TOKENS entry {position + 1}: expected [name=]token:scope[+scope...] with scopes from"
                f" {', '.join(SCOPES)}"
            )
        scopes = frozenset(s.strip() for s in scopes_text.split("+") if s.strip())
        unknown = sorted(scopes - set(SCOPES))
        if unknown or not scopes:
            raise ApiConfigError(
                f"HEDGEROW_TOKENS entry {position + 1}: unknown scope {unknown[0] if unknown else '(none)'!r};"
                f" scopes are {', '.join(SCOPES)}"
            )
        name: str | None = None
        head, eq, rest = token.partition("=")
        if eq and _NAME.fullmatch(head) and rest.strip("="):
            name, token = head, rest
        entries.append((name, token, scopes))
    return entries


def parse_tokens(text: str) -> dict[str, frozenset[str]]:
    """Parse ``[name=]token:scope+scope,...`` into ``{token: scopes}``.

    Raises:
        ApiConfigError: an entry without ``:``, an empty token, no scope, or an unknown scope
            (the message names ``HEDGEROW_TOKENS`` and the entry's position).
    """
    return {token: scopes for _name, token, scopes in _entries(text)}


def parse_token_names(text: str) -> dict[str, str]:
    """``{token: name}`` of the named entries of ``[name=]token:scope+scope,...``.

    Raises:
        ApiConfigError: as :func:`parse_tokens`.
    """
    return {token: name for name, token, _scopes in _entries(text) if name is not None}


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: Shortest token accepted on a host other than loopback (16 characters: ~95 bits when random
#: over letters and digits; a guessable token would make the auth decorative).
MIN_TOKEN_CHARS = 16


def check_listen_allowed(host: str, tokens: dict[str, frozenset[str]]) -> None:
    """Refuse to serve without tokens, or with a short token, on a non-loopback host.

    Raises:
        ApiConfigError: no tokens configured and ``host`` is not loopback, or a token shorter
            than :data:`MIN_TOKEN_CHARS` on such a host (named by its position, not its value).
    """
    if is_loopback(host):
        return
    if not tokens:
        raise ApiConfigError(
            f"refusing to listen on {host!r} without auth: set HEDGEROW_TOKENS "
            "(token:ingest+read+admin,...) or listen on 127.0.0.1"
        )
    for position, token in enumerate(tokens, start=1):
        if len(token) < MIN_TOKEN_CHARS:
            raise ApiConfigError(
                f"refusing to listen on {host!r}: token {position} of HEDGEROW_TOKENS has {len(token)} "
                f"characters, fewer than {MIN_TOKEN_CHARS}"
            )


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer <token>``, or None without one."""
    return _bearer(request.headers.get("authorization", ""))


def _bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    scheme, _, given = authorization.partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def token_scopes(tokens: dict[str, frozenset[str]], given: str | None) -> frozenset[str] | None:
    """The scopes of the configured token equal to ``given`` (compared in constant time), or None."""
    if not given:
        return None
    found: frozenset[str] | None = None
    for token, scopes in tokens.items():
        if hmac.compare_digest(token.encode(), given.encode()):
            found = scopes
    return found


def token_actor(tokens: Mapping[str, object], names: Mapping[str, str], given: str) -> str:
    """Who a token stands for in the audit trail: its name, else its fingerprint.

    The fingerprint is ``token:<first 12 hex digits of HMAC-SHA256(key, token)>`` whose key is
    every configured token (sorted, joined): the token itself is never stored, and a reader of the
    history (a ``read`` token) cannot test guesses of another token against it, since that needs
    every token. It stays the same while ``HEDGEROW_TOKENS`` does.

    Args:
        tokens: the configured tokens (``{token: scopes}``).
        names: ``{token: name}`` of the named entries.
        given: the caller's token.
    """
    for token, name in names.items():
        if hmac.compare_digest(token.encode(), given.encode()):
            return name
    key = "\n".join(sorted(tokens)).encode()
    return "token:" + hmac.new(key, given.encode(), hashlib.sha256).hexdigest()[:12]


def _auth_error(code: int, message: str) -> HTTPException:
    headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
    return HTTPException(code, detail={"field": "authorization", "message": message}, headers=headers)


class ScopeDependency:
    """The FastAPI dependency made by :func:`require_scope`: the request's token must have one of ``wanted``.

    Attributes:
        wanted: the accepted scopes, ``admin`` included; read by
            :func:`hedgerow.api._request_guard.route_scopes` to check a token before the body is read.
    """

    def __init__(self, wanted: frozenset[str]) -> None:
        self.wanted = wanted

    async def __call__(
        self,
        request: Request,
        _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER_SCHEME)],
    ) -> str | None:
        """Check the request's token (:func:`authorize`); returns its scopes joined by commas, or None."""
        return authorize(request, self.wanted)


def require_scope(*accepted: str) -> ScopeDependency:
    """A FastAPI dependency allowing a request whose token has any of the ``accepted`` scopes.

    ``admin`` is always accepted. Answers 401 without a valid bearer token, 403 when its scopes
    do not include any of ``accepted``; both ``{"detail": {"field": "authorization", "message"}}``.
    """
    return ScopeDependency(frozenset(accepted) | {"admin"})


def authorize(request: Request, wanted: frozenset[str]) -> str | None:
    """Check the request's bearer token has one of the ``wanted`` scopes (the rule of :func:`require_scope`).

    For a handler on the hot path that checks inline rather than through a dependency (the
    threshold poll: FastAPI's dependency solving cost a third of its time); such a route
    declares :data:`BEARER_SECURITY` in its OpenAPI ``security`` itself.

    Args:
        request: the request.
        wanted: the accepted scopes, ``admin`` included.

    Returns:
        None when no tokens are configured, else the token's scopes joined by commas.

    Raises:
        HTTPException: 401 without a valid token, 403 when it has none of ``wanted``.
    """
    return check_bearer(app_state(request.app).tokens, request.headers.get("authorization", ""), wanted)


def check_bearer(tokens: dict[str, frozenset[str]], authorization: str, wanted: frozenset[str]) -> str | None:
    """The rule of :func:`authorize` on the raw ``Authorization`` header (also checked, for a request
    with a body, before the body is read: :mod:`hedgerow.api._request_guard`).

    Args:
        tokens: the configured tokens (``{token: scopes}``); empty: every request is allowed.
        authorization: the request's ``Authorization`` header ("" without one).
        wanted: the accepted scopes, ``admin`` included.

    Returns:
        None when no tokens are configured, else the token's scopes joined by commas.

    Raises:
        HTTPException: 401 without a valid token, 403 when it has none of ``wanted``.
    """
    if not tokens:
        return None
    scopes = token_scopes(tokens, _bearer(authorization))
    if scopes is None:
        raise _auth_error(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token")
    if not scopes & wanted:
        raise _auth_error(status.HTTP_403_FORBIDDEN, f"token lacks scope: needs one of {', '.join(sorted(wanted))}")
    return ",".join(sorted(scopes))
