"""The client's exception tree.

``HedgeError`` is the root of everything the hedging client raises on purpose::

    HedgeError
    ├── UpstreamError       a non-retryable 4xx (400/401/403/404/422): the caller's fault, no failover
    ├── AllAttemptsFailed   every attempt failed before a first token; ``.errors`` has each one
    ├── AttemptError        one attempt's own failure (HTTP status, SSE error, bad stream); only
    │   │                   found inside ``AllAttemptsFailed.errors``, never raised to the caller
    │   └── EventTooLarge   an SSE event or line longer than ``HedgePolicy.max_event_bytes``
    ├── StreamError         the winner failed after its first token (truncated, error payload)
    ├── StallTimeout        after the first token, a gap longer than ``stall_timeout_s``
    └── TotalTimeout        the whole call exceeded ``total_timeout_s``

Each carries the call's ``CallRecord`` (``.record``) once the call has ended, so the caller can
log what happened even on failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hedgerow.client.records import CallRecord

__all__ = [
    "AllAttemptsFailed",
    "AttemptError",
    "EventTooLarge",
    "HedgeError",
    "StallTimeout",
    "StreamError",
    "TotalTimeout",
    "UpstreamError",
    "describe",
]


class HedgeError(Exception):
    """Root of the hedging client's errors; ``record`` is the call's record (or None)."""

    record: CallRecord | None = None


class UpstreamError(HedgeError):
    """An upstream answered a non-retryable HTTP status (400/401/403/404/422).

    Args:
        upstream: the upstream's name.
        status_code: the HTTP status.
        body_excerpt: the first few hundred characters of the response body.
        hint: an optional sentence on the likely cause, appended to the message (a 404 from an
            upstream whose ``base_url`` does not end in ``/v1`` says so).
    """

    def __init__(self, upstream: str, status_code: int, body_excerpt: str, *, hint: str | None = None) -> None:
        self.upstream = upstream
        self.status_code = status_code
        self.body_excerpt = body_excerpt
        self.hint = hint
        message = f"upstream {upstream!r} answered HTTP {status_code}: {body_excerpt}"
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class AllAttemptsFailed(HedgeError):
    """Every attempt of a call failed before producing a first token.

    Args:
        errors: one ``(upstream name, exception)`` pair per failed attempt, in start order.
    """

    def __init__(self, errors: list[tuple[str, BaseException]]) -> None:
        self.errors = list(errors)
        parts = "; ".join(f"{name}: {describe(exc)}" for name, exc in self.errors)
        super().__init__(f"all {len(self.errors)} attempt(s) failed: {parts}")


class StallTimeout(HedgeError):
    """After the first token, no chunk arrived for longer than ``stall_timeout_s`` seconds."""

    def __init__(self, upstream: str, gap_s: float) -> None:
        self.upstream = upstream
        self.gap_s = gap_s
        super().__init__(f"upstream {upstream!r} stalled: no chunk for {gap_s:.3f} s")


class TotalTimeout(HedgeError):
    """The call did not finish within ``total_timeout_s`` seconds."""

    def __init__(self, total_timeout_s: float) -> None:
        self.total_timeout_s = total_timeout_s
        super().__init__(f"call exceeded total_timeout_s={total_timeout_s:g} s")


class AttemptError(HedgeError):
    """One attempt failed before its first token for a reason of the upstream's making.

    The hedging client fails over on it; the caller sees it only inside
    ``AllAttemptsFailed.errors`` (transport errors such as ``httpx.ConnectError`` appear there
    as they are).

    Args:
        error_type: short machine name stored in the attempt's record (``http_503``,
            ``sse_error``, ``malformed_stream``, ``empty_stream``).
        message: one line of detail.
    """

    def __init__(self, error_type: str, message: str) -> None:
        self.error_type = error_type
        super().__init__(message)


class EventTooLarge(AttemptError):
    """An attempt's SSE event (or one line of it) grew past ``HedgePolicy.max_event_bytes``.

    ``error_type`` is ``event_too_large``; before the first token the call fails over, after it
    the call raises ``StreamError`` with that ``error_type``.

    Args:
        limit: the bound that was exceeded, bytes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__("event_too_large", f"an SSE event exceeded max_event_bytes={limit} bytes without a blank line")


def describe(exc: BaseException) -> str:
    """One line naming an exception: its class (or ``error_type``) and message.

    Examples: ``ConnectError: All connection attempts failed``, ``http_503: HTTP 503: busy``.
    """
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = exc.error_type if isinstance(exc, AttemptError) else type(exc).__name__
    return f"{name}: {text}" if text else name


class StreamError(HedgeError):
    """The winning attempt failed after its first token (tokens already reached the caller).

    Args:
        upstream: the winner's name.
        error_type: short machine name (``truncated``, ``sse_error``, ``malformed_stream``, ...).
        detail: one line of detail.
    """

    def __init__(self, upstream: str, error_type: str, detail: str) -> None:
        self.upstream = upstream
        self.error_type = error_type
        self.detail = detail
        super().__init__(f"upstream {upstream!r} failed mid-stream ({error_type}): {detail}")
