"""The one rule for an attempt's failure class, shared by the store's per-upstream figures and ``/metrics``.

Imports nothing, so the api's ingest path can count failures without loading the store's readers.
"""

from __future__ import annotations

__all__ = ["FAILURE_KINDS", "failure_kind"]

#: Failure classes of an attempt, in table order.
FAILURE_KINDS: tuple[str, ...] = ("error", "timeout", "stall")


def failure_kind(outcome: str, error_type: str | None) -> str | None:
    """The failure class of one attempt, from its ``error_type`` (the classes do not overlap).

    Args:
        outcome: ``won``, ``cancelled`` or ``failed``.
        error_type: the attempt's ``error_type`` or None.

    Returns:
        ``stall`` for ``stall_timeout`` (a gap after the first token); ``timeout`` for any other
        type ending in ``timeout`` (``total_timeout``, ``ReadTimeout``, ``ConnectTimeout``, ...);
        ``error`` for every other type (``http_503``, ``ConnectError``, ``truncated``, ...) and for
        a ``failed`` attempt without one; None when the attempt did not fail.
    """
    if error_type is None:
        return "error" if outcome == "failed" else None
    if error_type == "stall_timeout":
        return "stall"
    if error_type.lower().endswith("timeout"):
        return "timeout"
    return "error"
