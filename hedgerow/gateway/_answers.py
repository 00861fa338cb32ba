"""The gateway's own answers: OpenAI-shaped error bodies and whole responses sent over ASGI.

Every refusal and failure the gateway answers itself is ``{"error": {"message", "type", "param",
"code"}}`` JSON (:func:`openai_error`), sent whole by :func:`answer`; never a traceback or an HTML
page. Also here: the ASGI callable types shared by the gateway's modules, the excerpt of an
upstream's error body (:func:`error_message`, read at most :data:`MAX_ERROR_BODY` bytes by
:func:`read_capped`), and what a call that failed before any answer gives: its ``X-Hedgerow-*``
headers (:func:`failure_headers`), whether any attempt reached an upstream
(:func:`reached_upstream`: 502, else 503) and the note on a backup the failover budget refused
(:func:`budget_note`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import httpx

from hedgerow.client.errors import AllAttemptsFailed
from hedgerow.client.transport import HEDGED_HEADER, REQUEST_ID_HEADER, WINNER_HEADER

__all__ = [
    "MAX_ERROR_BODY",
    "REDACTED",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "answer",
    "budget_note",
    "error_message",
    "failure_headers",
    "method_not_allowed",
    "model_not_found",
    "not_found",
    "openai_error",
    "reached_upstream",
    "read_capped",
    "record_of",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: What a configured key is replaced by in an error body or a log line.
REDACTED = "[redacted]"
#: Largest error body read to redact and re-send, bytes (a larger one is cut there).
MAX_ERROR_BODY = 64 * 1024


def openai_error(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """The body of an OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


async def read_capped(response: httpx.Response) -> bytes:
    """The first ``MAX_ERROR_BODY`` bytes of ``response``'s body (decoded from its content encoding)."""
    parts: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        parts.append(piece)
        size += len(piece)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(parts)[:MAX_ERROR_BODY]


def error_message(content: bytes) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else its first line of text."""
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        if isinstance(message, str):
            return message
    text = content.decode("utf-8", "replace").strip()
    if text.lstrip().startswith("<"):  # an HTML error page says nothing useful here
        return ""
    return (text.splitlines() or [""])[0]


def model_not_found(name: str) -> bytes:
    """The OpenAI 404 ``model_not_found`` body for a model ``name`` no route serves."""
    return openai_error(
        f"The model {name!r} does not exist on this hedgerow gateway (GET /v1/models lists them)",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def not_found(path: str) -> bytes:
    """The 404 ``unknown_url`` body for a ``path`` the gateway does not serve."""
    return openai_error(f"hedgerow gateway: no route for {path!r}", "invalid_request_error", "unknown_url")


def record_of(exc: BaseException) -> object | None:
    """The ``CallRecord`` of a call whose transport error ``exc`` has a hedgerow error as its
    cause (``httpx.ConnectError`` from ``AllAttemptsFailed``, ...), else None."""
    return getattr(exc.__cause__, "record", None)


def reached_upstream(exc: BaseException) -> bool:
    """Whether any attempt of a call that failed with ``exc`` reached an upstream: an error other
    than a connection refused or a connect timeout (an HTTP status, a body that was not a
    stream, a read error). False when ``exc`` is not caused by ``AllAttemptsFailed``."""
    cause = exc.__cause__
    if not isinstance(cause, AllAttemptsFailed):
        return False
    return any(not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)) for _, error in cause.errors)


def budget_note(record: object | None) -> str:
    """A sentence to end a failure's message with when the failover budget refused the backup
    (the record's ``failover_denied``); ``""`` otherwise."""
    if getattr(record, "failover_denied", False):
        return "; the backup was not tried because the failover budget was spent (upstreams are failing)"
    return ""


def method_not_allowed(method: str, path: str, allowed: str) -> bytes:
    """The 405 ``method_not_allowed`` body for a ``method`` a known ``path`` does not answer
    (``allowed``: the one it does, also sent as the ``Allow`` header)."""
    return openai_error(
        f"hedgerow gateway: {path!r} answers {allowed}, not {method}",
        "invalid_request_error",
        "method_not_allowed",
    )


def failure_headers(exc: BaseException) -> list[tuple[bytes, bytes]]:
    """The ``X-Hedgerow-*`` headers of a call that failed before any answer: its request id (from
    the record the transport's error carries as its cause, so the caller can find the record),
    no winner, and whether it hedged. Empty when the error carries no record."""
    record = record_of(exc)
    request_id = getattr(record, "request_id", None)
    if not request_id:
        return []
    hedged = "true" if getattr(record, "hedged", False) else "false"
    return [
        (REQUEST_ID_HEADER.lower().encode("latin-1"), str(request_id).encode("latin-1")),
        (WINNER_HEADER.lower().encode("latin-1"), b""),
        (HEDGED_HEADER.lower().encode("latin-1"), hedged.encode("latin-1")),
    ]


async def answer(
    send: Send,
    status: int,
    content: bytes,
    *,
    extra: Sequence[tuple[bytes, bytes]] = (),
    headers: Sequence[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole response (JSON unless ``headers`` say otherwise)."""
    out = list(headers) if headers is not None else [(b"content-type", b"application/json")]
    out.append((b"content-length", str(len(content)).encode()))
    out.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": content, "more_body": False})
