"""The one rule for which attempt times are TTFT samples, shared by ingest and the tick.

Ingest counts each call's samples into the minute aggregates (:mod:`hedgerow.controller.policy.minute_counts`)
and the tick reads raw calls (:mod:`hedgerow.controller.policy._policy_window`) by this rule, so both see
the same samples. This module imports nothing, so ingest does not load the estimation stack.
"""

from __future__ import annotations

__all__ = ["ttft_sample"]


def ttft_sample(start_s: float, first_token_s: float | None, end_s: float, outcome: str) -> tuple[float, bool] | None:
    """One attempt as a TTFT sample measured from its own send: ``(duration_s, censored)``.

    Args:
        start_s / first_token_s / end_s: the attempt's times, seconds from the call's start
            (``first_token_s`` None without a first token).
        outcome: ``won``, ``cancelled`` or ``failed``.

    Returns:
        ``(first_token_s - start_s, False)`` with a first token; ``(end_s - start_s, True)``
        for an attempt cancelled before one; None for a failed attempt (fast failures would
        drag the estimate down).
    """
    if first_token_s is not None:
        return max(0.0, first_token_s - start_s), False
    if outcome == "cancelled":
        return max(0.0, end_s - start_s), True
    return None
