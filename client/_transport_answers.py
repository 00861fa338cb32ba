"""The headers and the answers of hedgerow's transport that are not an upstream's body.

Behind :class:`hedgerow.client.transport.HedgingTransport`: hedgerow's three response headers
(``mark``), an upstream's response headers kept for the app (``answer_headers``), an
OpenAI-style error answered by hedgerow itself (``error_response``), and the mapping of a call
that failed before any answer to a response or an httpx error (``failure``, the module table of
:mod:`hedgerow.client.transport`).
"""

from __future__ import annotations

import json

import httpx

from hedgerow.client.errors import (
    AllAttemptsFailed,
    HedgeError,
    StallTimeout,
    TotalTimeout,
    UpstreamError,
)

__all__ = [
    "DROP_RESPONSE",
    "HEDGED_HEADER",
    "HOP_BY_HOP",
    "RECORD_EXTENSION",
    "REQUEST_ID_HEADER",
    "WINNER_HEADER",
    "answer_headers",
    "error_response",
    "failure",
    "mark",
]

#: Response header names added to every response.
REQUEST_ID_HEADER = "X-Hedgerow-Request-Id"
WINNER_HEADER = "X-Hedgerow-Winner"
#: ``true`` when a backup attempt was started: by the hedge delay (a hedge) or after an attempt failed
#: (a failover), whatever the outcome; ``false`` otherwise.
HEDGED_HEADER = "X-Hedgerow-Hedged"

#: The ``httpx.Response.extensions`` key of the ``CallRecord`` on the error response of a call
#: whose attempts all failed (an app such as the gateway reads it; SDKs ignore extensions).
RECORD_EXTENSION = "hedgerow_record"

#: Hop-by-hop header names (lower case): never forwarded in either direction.
HOP_BY_HOP = frozenset(
    {"host", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "upgrade"}
)
#: Response headers that describe the upstream's framing or encoding, not the body handed back.
DROP_RESPONSE = HOP_BY_HOP | {"content-length", "content-encoding", "transfer-encoding"}


def mark(headers: httpx.Headers, request_id: str, winner: str, hedged: bool) -> None:
    """Set hedgerow's three response headers on ``headers`` (in place).

    Args:
        headers: the response headers to mark.
        request_id: the call's id (``""`` for an answer of hedgerow itself).
        winner: the name of the upstream whose answer this is (``""`` when no attempt won).
        hedged: whether a backup attempt was started (by the hedge delay or by a failover).
    """
    headers[REQUEST_ID_HEADER] = request_id
    headers[WINNER_HEADER] = winner
    headers[HEDGED_HEADER] = "true" if hedged else "false"


def answer_headers(upstream_headers: httpx.Headers | None, request_id: str, winner: str, hedged: bool) -> httpx.Headers:
    """The upstream's headers minus framing/encoding ones, plus hedgerow's three."""
    kept = (
        []
        if upstream_headers is None
        else [(k, v) for k, v in upstream_headers.multi_items() if k.lower() not in DROP_RESPONSE]
    )
    headers = httpx.Headers(kept)
    mark(headers, request_id, winner, hedged)
    return headers


def error_response(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None
) -> httpx.Response:
    """An OpenAI-style error answered by hedgerow itself (no upstream contacted)."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": None}}
    headers = httpx.Headers({"Content-Type": "application/json"})
    mark(headers, "", "", False)
    return httpx.Response(status, headers=headers, content=json.dumps(body).encode())


def failure(request: httpx.Request, exc: HedgeError, request_id: str) -> httpx.Response:
    """Map a call that failed before any answer to a response (an upstream's error) or raise.

    Args:
        request: the app's request (set on the response or the error).
        exc: what the hedged call raised.
        request_id: the call's id, for the headers.

    Returns:
        The response of an upstream's 4xx handed back, or of the last attempt's HTTP error status
        (the call's record in its extensions, under ``RECORD_EXTENSION``).

    Raises:
        httpx.ConnectError: every attempt failed without an HTTP error response.
        httpx.ReadTimeout: the call's total or stall timeout.
        httpx.ReadError: any other failure of the call.
    """
    hedged = bool(exc.record.hedged) if exc.record is not None else False
    # No attempt won: the winner header is empty (the failing upstream is in the record).
    if isinstance(exc, UpstreamError):
        headers = answer_headers(None, request_id, "", hedged)
        headers["Content-Type"] = _content_type(exc.body_excerpt.encode())
        return httpx.Response(exc.status_code, headers=headers, content=exc.body_excerpt.encode(), request=request)
    if isinstance(exc, AllAttemptsFailed):
        for _name, error in reversed(exc.errors):
            status = getattr(error, "status_code", None)
            if isinstance(status, int) and status >= 400:
                content = getattr(error, "content", None)
                if not isinstance(content, bytes):
                    content = str(getattr(error, "body_excerpt", "") or "").encode()
                headers = answer_headers(getattr(error, "headers", None), request_id, "", hedged)
                if "content-type" not in headers:
                    headers["Content-Type"] = _content_type(content)
                extensions = {RECORD_EXTENSION: exc.record}
                return httpx.Response(status, headers=headers, content=content, request=request, extensions=extensions)
        raise httpx.ConnectError(str(exc), request=request) from exc
    if isinstance(exc, (TotalTimeout, StallTimeout)):
        raise httpx.ReadTimeout(str(exc), request=request) from exc
    raise httpx.ReadError(str(exc), request=request) from exc


def _content_type(content: bytes) -> str:
    """The ``Content-Type`` of an error body: JSON when it parses as JSON, else plain text."""
    try:
        json.loads(content)
    except ValueError:
        return "text/plain; charset=utf-8"
    return "application/json"
