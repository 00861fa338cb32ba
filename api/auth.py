"""Bearer-token auth with scopes.

``settings.tokens`` is ``token:scope+scope,token:scope`` (e.g. ``s3cret:ingest+read,ops:admin``).
Scopes: ``ingest`` (post calls, read thresholds), ``read`` (read everything), ``admin``
(everything). With no tokens configured every request is allowed, and the server refuses to
listen on anything but loopback (:func:`check_listen_allowed`).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hedgerow.api.errors import ApiConfigError

__all__ = [
    "BEARER_SCHEME",
    "MIN_TOKEN_CHARS",
    "SCOPES",
    "check_listen_allowed",
    "is_loopback",
    "parse_tokens",
    "require_scope",
]

SCOPES: tuple[str, ...] = ("ingest", "read", "admin")

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


def parse_tokens(text: str) -> dict[str, frozenset[str]]:
    """Parse ``token:scope+scope,...`` into ``{token: scopes}``.

    Raises:
        ApiConfigError: an entry without ``:``, an empty token, no scope, or an unknown scope.
    """
    tokens: dict[str, frozenset[str]] = {}
    for position, entry in enumerate(part.strip() for part in text.split(",")):
        if not entry:
            continue
        token, sep, scopes_text = entry.rpartition(":")
        if not sep or not token:
            raise ApiConfigError(
                f"tokens entry {position + 1}: expected token:scope[+scope...] with scopes from {', '.join(SCOPES)}"
            )
        scopes = frozenset(s.strip() for s in scopes_text.split("+") if s.strip())
        unknown = sorted(scopes - set(SCOPES))
        if unknown or not scopes:
            raise ApiConfigError(
                f"tokens entry {position + 1}: unknown scope {unknown[0] if unknown else '(none)'!r};"
                f" scopes are {', '.join(SCOPES)}"
            )
        tokens[token] = scopes
    return tokens


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


def require_scope(*accepted: str) -> Callable[..., Any]:
    """A FastAPI dependency allowing a request whose token has any of the ``accepted`` scopes.

    ``admin`` is always accepted. Answers 401 without a valid bearer token, 403 when its scopes
    do not include any of ``accepted``.
    """
    wanted = set(accepted) | {"admin"}

    async def dependency(
        request: Request,
        _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER_SCHEME)],
    ) -> str | None:
        tokens: dict[str, frozenset[str]] = request.app.state.tokens
        if not tokens:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        scopes: frozenset[str] | None = None
        if scheme.lower() == "bearer" and given:
            for token, token_scopes in tokens.items():
                if hmac.compare_digest(token.encode(), given.strip().encode()):
                    scopes = token_scopes
        if scopes is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                detail="missing or invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not scopes & wanted:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"token lacks scope: needs one of {', '.join(sorted(wanted))}",
            )
        return ",".join(sorted(scopes))

    return dependency
