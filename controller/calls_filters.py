"""The calls explorer's vocabulary and bounds, shared by the store, the api, the console and the CLI.

A call's *outcome* is one of :data:`CALL_OUTCOMES`, read from the record's own fields (``status``,
``winner``, ``hedge_reason``; :mod:`hedgerow.client.records`) by :func:`call_outcome`:

- ``primary_won``: the call succeeded (``status`` ``ok``) and the primary gave the first token
  (hedged or not);
- ``hedge_won``: it succeeded and the backup started by a hedge (``hedge_reason``
  ``ttft_timeout``) gave the first token;
- ``failover``: it succeeded through a backup started because the primary failed
  (``hedge_reason`` ``primary_error``);
- ``failed``: it ended in ``error``, ``timeout`` or ``stalled``;
- ``cancelled``: the app cancelled it.

Every call has exactly one outcome. Pages are keyset-paged, newest first: a cursor names the
last call shown, ``(started_at, id)`` (:func:`encode_cursor`), and the next page starts after
it, so a page costs the same however deep it is and calls stored meanwhile shift nothing.

Like :mod:`hedgerow.controller.ops_bounds`, this module needs only the standard library, so the
CLI checks its flags with the api's rule before it sends a request.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

__all__ = [
    "CALL_OUTCOMES",
    "DEFAULT_CALLS_LIMIT",
    "MAX_CALLS_LIMIT",
    "MAX_SCAN_CALLS",
    "call_outcome",
    "calls_filter_error",
    "decode_cursor",
    "encode_cursor",
]

#: Every outcome a call can have, and what it means (the filter takes these names).
CALL_OUTCOMES: dict[str, str] = {
    "primary_won": "succeeded; the primary gave the first token",
    "hedge_won": "succeeded; the hedge's backup gave the first token",
    "failover": "succeeded through a backup started because the primary failed",
    "failed": "ended in error, timeout or stall",
    "cancelled": "cancelled by the app",
}
#: Calls per page when no ``limit`` is given.
DEFAULT_CALLS_LIMIT = 50
#: Most calls one page holds (``limit`` above it is refused): each call brings its attempts.
MAX_CALLS_LIMIT = 500
#: Most calls one filtered page examines (newest first from its cursor): a rare outcome or winner
#: on a busy route gives a short page and a cursor, never a read of every call kept.
MAX_SCAN_CALLS = 20_000
#: Statuses of a call that ended without an answer (the ``failed`` outcome).
FAILED_STATUSES: tuple[str, ...] = ("error", "timeout", "stalled")
_MAX_CURSOR_CHARS = 200


def call_outcome(status: str, winner: str | None, hedge_reason: str | None) -> str:
    """The outcome of a call (a key of :data:`CALL_OUTCOMES`) from its record's fields.

    Args:
        status: the call's ``status`` (``ok``, ``error``, ``timeout``, ``stalled``, ``cancelled``).
        winner: the role of the attempt that gave the first token (``primary``, ``backup``), or None.
        hedge_reason: why a backup started (``ttft_timeout``, ``primary_error``), or None.

    Returns:
        ``cancelled``, ``failed``, ``failover``, ``hedge_won`` or ``primary_won``.
    """
    if status == "cancelled":
        return "cancelled"
    if status != "ok":
        return "failed"
    if winner == "backup":
        return "failover" if hedge_reason == "primary_error" else "hedge_won"
    return "primary_won"


def encode_cursor(started_at: datetime, call_id: int) -> str:
    """The cursor naming a call: where the next page (older calls) starts.

    Args:
        started_at: the call's start (aware).
        call_id: the call's ``calls.id``.

    Returns:
        URL-safe text (base64 of ``<ISO 8601 UTC>|<id>``, no padding).
    """
    plain = f"{started_at.astimezone(UTC).isoformat()}|{call_id}"
    return base64.urlsafe_b64encode(plain.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, int]:
    """The ``(started_at, id)`` a cursor of :func:`encode_cursor` names.

    Args:
        text: the cursor as given back by a page.

    Returns:
        The aware UTC start and the call id.

    Raises:
        ValueError: not a cursor of this api (a sentence saying so).
    """
    problem = "not a cursor of this api: pass back the next_cursor of a page"
    if not text or len(text) > _MAX_CURSOR_CHARS:
        raise ValueError(problem)
    try:
        plain = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when_text, id_text = plain.split("|")
        when = datetime.fromisoformat(when_text)
        call_id = int(id_text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(problem) from None
    if when.tzinfo is None or not 0 <= call_id < 2**63:
        raise ValueError(problem)
    return when.astimezone(UTC), call_id


def calls_filter_error(
    *,
    outcome: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> tuple[str, str] | None:
    """What is wrong with a calls-explorer filter, or None when the store can answer it.

    The rule of ``GET /v1/routes/{route}/calls``, the console's calls page and ``hedgerow routes
    calls``: a filter that could only give an empty list (an unknown outcome, ``since`` after
    ``until``) is refused, since an empty list reads as "no such calls".

    Args:
        outcome: the outcome asked for, or None; one of :data:`CALL_OUTCOMES`.
        since, until: the time window (aware), or None.
        limit: calls per page, or None; 1 to :data:`MAX_CALLS_LIMIT`.

    Returns:
        ``(parameter, message)``, e.g. ``("outcome", "unknown outcome 'won'; outcomes: ...")``;
        None when the filter is fine.
    """
    if outcome is not None and outcome not in CALL_OUTCOMES:
        return "outcome", f"unknown outcome {outcome!r}; outcomes: {', '.join(CALL_OUTCOMES)}"
    if since is not None and until is not None and since > until:
        return "since", f"must not be after until ({since.isoformat()} > {until.isoformat()})"
    if limit is not None and not 1 <= limit <= MAX_CALLS_LIMIT:
        return "limit", f"must be from 1 to {MAX_CALLS_LIMIT}, got {limit}"
    return None
