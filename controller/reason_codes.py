"""The reason codes a policy decision can carry (``Decision.reason``), without the policy's imports.

``hedgerow.controller.policy`` re-exports :data:`REASON_CODES` and its module docstring gives
each code's meaning. The set lives here, in a module that imports nothing beyond the standard
library, so that callers which only validate a code (``hedgerow routes history --reason``, the
ops pages' filter) do not load numpy and scipy with the policy.
"""

from __future__ import annotations

__all__ = ["REASON_CODES"]

#: Every code ``policy.decide`` can put in ``Decision.reason`` (and ``config``, set by
#: ``routes_admin`` when an operator changed the route).
REASON_CODES: frozenset[str] = frozenset(
    {
        "disabled",
        "pinned",
        "too_few_samples",
        "small_sample_raise",
        "cold_start_supported",
        "censored_raise",
        "censored_hold",
        "budget_bound",
        "tail_min",
        "cost_tie",
        "replay_hold",
        "raise_over_budget",
        "hysteresis_hold",
        "step_down_limited",
        "clamped_min",
        "clamped_max",
        "drift_window",
        "backups_rarely_win",
        "hedges_did_not_lower_p99",
        "config",
    }
)
