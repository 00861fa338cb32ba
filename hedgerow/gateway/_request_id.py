"""Request ids on every answer: the caller's ``X-Request-ID`` (read from the request, echoed on
the response, logged) and hedgerow's own ``X-Hedgerow-Request-Id`` (never missing nor empty:
:func:`with_hedgerow_id`).

A caller that sends ``X-Request-ID`` gets the same value back on every answer of the gateway
(a winner's, a passed-through 4xx, a refusal, a 502/503/504), in place of any ``x-request-id``
the answering upstream sent, and finds it in the request's ``gateway_call`` and
``gateway_request`` log lines as ``caller_request_id``. It is only echoed and logged: the
record's ``request_id`` stays hedgerow's own (the store deduplicates on it, so a caller's reused
id must not become it), and hedged calls send each upstream hedgerow's per-attempt id instead.

A value is used when it is 1 to :data:`MAX_LENGTH` printable ASCII characters (space to ``~``);
any other value is ignored (not echoed, not logged), without a warning: a caller's header is
not an error of the gateway's. With several ``X-Request-ID`` headers the first one counts.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextvars import ContextVar

from hedgerow.client.transport import REQUEST_ID_HEADER

__all__ = ["CALLER_REQUEST_ID", "HEADER", "MAX_LENGTH", "caller_request_id", "echoed", "with_hedgerow_id"]

#: The header's name as ASGI gives it (lower-case bytes).
HEADER = b"x-request-id"
#: hedgerow's own request id header as ASGI sends it (lower-case bytes).
HEDGEROW_HEADER = REQUEST_ID_HEADER.lower().encode("latin-1")
#: Longest caller's request id used, characters.
MAX_LENGTH = 200
#: The caller's request id of the request being served in this context (None: none usable).
CALLER_REQUEST_ID: ContextVar[str | None] = ContextVar("hedgerow_gateway_caller_request_id", default=None)


def caller_request_id(raw_headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The caller's ``X-Request-ID``, or None when absent or not usable.

    Args:
        raw_headers: the request's ASGI headers (lower-case name bytes, value bytes).

    Returns:
        The first ``X-Request-ID`` value when it is 1 to ``MAX_LENGTH`` printable ASCII
        characters (0x20 to 0x7E), else None.
    """
    for name, value in raw_headers:
        if name == HEADER:
            if 0 < len(value) <= MAX_LENGTH and all(0x20 <= byte <= 0x7E for byte in value):
                return value.decode("ascii")
            return None
    return None


def echoed(headers: Sequence[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
    """Response ``headers`` with ``X-Request-ID: request_id`` in place of any ``x-request-id``.

    Args:
        headers: an ASGI ``http.response.start`` message's headers.
        request_id: the caller's request id (from :func:`caller_request_id`).

    Returns:
        A new list: the other headers in their order, then the caller's id.
    """
    out = [(name, value) for name, value in headers if name.lower() != HEADER]
    out.append((HEADER, request_id.encode("ascii")))
    return out


def with_hedgerow_id(headers: Sequence[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], str]:
    """Response ``headers`` with exactly one non-empty ``X-Hedgerow-Request-Id``.

    The call's id, set by the transport, is kept; where the answer made no call (a refusal of
    the gateway, hedgerow's 400 for a bad body, a pass-through path), or the header is empty, a
    new id (a random UUID as 32 hex digits) takes its place, so every answer names one.

    Args:
        headers: an ASGI ``http.response.start`` message's headers.

    Returns:
        ``(headers, request_id)``: a new list (the other headers in their order, then the id
        when it had to be added) and the id it carries.
    """
    out: list[tuple[bytes, bytes]] = []
    found = b""
    for name, value in headers:
        if name.lower() == HEDGEROW_HEADER:
            if value and not found:
                found = value
                out.append((HEDGEROW_HEADER, value))
            continue
        out.append((name, value))
    if not found:
        found = uuid.uuid4().hex.encode("ascii")
        out.append((HEDGEROW_HEADER, found))
    return out, found.decode("latin-1")
