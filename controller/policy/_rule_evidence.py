"""Rule 4 of the policy: the short window's binomial test of the proposed value, and the raise to
the least value it accepts. Behind the facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hedgerow.controller.policy._rule_binomial import binomial_lower_bound, known_over, least_accepted_value
from hedgerow.controller.policy._rule_types import Inputs, Proposal

__all__ = [
    "over_budget_evidence",
    "short_window_over",
]


def short_window_over(x: Inputs, value_s: float) -> bool:
    """True when the short window shows ``value_s`` over budget (rule 4's test)."""
    obs = x.observation
    durations = np.asarray(obs.short_durations_s, dtype=float)
    if obs.short_window_calls < x.knobs.short_window_min_calls or durations.size == 0:
        return False
    over, known = known_over(durations, np.asarray(obs.short_censored, dtype=bool), value_s)
    return binomial_lower_bound(over, known, x.knobs.confidence) > x.config.budget


def over_budget_evidence(p: Proposal, x: Inputs) -> Proposal:
    """Rule 4: the short window shows the proposed value over budget: raise to what it supports."""
    if p.settled:
        return p
    obs = x.observation
    durations = np.asarray(obs.short_durations_s, dtype=float)
    if obs.short_window_calls < x.knobs.short_window_min_calls or durations.size == 0:
        return p
    flags = np.asarray(obs.short_censored, dtype=bool)
    over, known = known_over(durations, flags, p.value)
    bound = binomial_lower_bound(over, known, x.knobs.confidence)
    test = {
        "value_s": p.value,
        "samples": int(durations.size),
        "known": known,
        "known_over": over,
        "lower_bound": bound,
        "over_budget": bool(bound > x.config.budget),
    }
    if bound <= x.config.budget:
        return replace(p, details=p.details | {"over_budget_test": test})
    value = least_accepted_value(durations, flags, x.config.budget, x.knobs.confidence, p.value)
    return p.with_value(value, ("raise_over_budget",), "evidence", over_budget_test=test | {"raised_to_s": value})
