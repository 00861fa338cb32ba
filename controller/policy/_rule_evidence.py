"""Rule 4 of the policy: the short window's binomial test of the proposed value, and the raise to
the least value it accepts. Behind the facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from hedgerow.controller.policy._rule_binomial import binomial_lower_bound, known_over, least_accepted_value
from hedgerow.controller.policy._rule_types import Inputs, Proposal

__all__ = [
    "over_budget_evidence",
    "short_window_over",
    "short_window_test",
]


def short_window_test(x: Inputs, value_s: float) -> dict[str, Any] | None:
    """Rule 4's test of ``value_s`` on the short window's primaries: the one copy of the test that
    rule 4 applies to a proposal and rule 5 to the current value.

    Args:
        x: the rules' inputs (the short window's durations, s, and censoring flags; the budget;
            ``short_window_min_calls`` and ``confidence``).
        value_s: the ``hedge_after_s`` tested, seconds.

    Returns:
        None when the short window has fewer calls than ``short_window_min_calls`` or no primary
        sample (no test); else ``{"value_s", "samples", "known", "known_over", "lower_bound",
        "over_budget"}``: ``over_budget`` is True when the one-sided binomial lower bound of the
        share of primaries known to wait longer than ``value_s`` exceeds the budget.
    """
    obs = x.observation
    durations = np.asarray(obs.short_durations_s, dtype=float)
    if obs.short_window_calls < x.knobs.short_window_min_calls or durations.size == 0:
        return None
    over, known = known_over(durations, np.asarray(obs.short_censored, dtype=bool), value_s)
    bound = binomial_lower_bound(over, known, x.knobs.confidence)
    return {
        "value_s": value_s,
        "samples": int(durations.size),
        "known": known,
        "known_over": over,
        "lower_bound": bound,
        "over_budget": bool(bound > x.config.budget),
    }


def short_window_over(x: Inputs, value_s: float) -> bool:
    """True when the short window shows ``value_s`` over budget (:func:`short_window_test`)."""
    test = short_window_test(x, value_s)
    return test is not None and test["over_budget"]


def over_budget_evidence(p: Proposal, x: Inputs) -> Proposal:
    """Rule 4: the short window shows the proposed value over budget: raise to what it supports."""
    if p.settled:
        return p
    test = short_window_test(x, p.value)
    if test is None:
        return p
    if not test["over_budget"]:
        return replace(p, details=p.details | {"over_budget_test": test})
    obs = x.observation
    durations = np.asarray(obs.short_durations_s, dtype=float)
    flags = np.asarray(obs.short_censored, dtype=bool)
    value = least_accepted_value(durations, flags, x.config.budget, x.knobs.confidence, p.value)
    return p.with_value(value, ("raise_over_budget",), "evidence", over_budget_test=test | {"raised_to_s": value})
