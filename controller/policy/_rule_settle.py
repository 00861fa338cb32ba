"""Rules 1 and 2 of the policy: the route's state (disabled, pinned) and too few samples (the cold
start and the small-sample raise). Each settles the proposal so that the search rules are skipped.
Behind the facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hedgerow.controller.policy._rule_binomial import (
    binomial_lower_bound,
    cold_start_confidence,
    known_over,
    lowest_supported_value,
    supported_value,
)
from hedgerow.controller.policy._rule_types import Inputs, Proposal

__all__ = [
    "COLD_SOURCES",
    "route_state",
    "small_sample",
]


def route_state(p: Proposal, x: Inputs) -> Proposal:
    """Rule 1: a disabled route keeps its value, a pinned one publishes the pinned value."""
    if not x.config.enabled:
        return replace(p, codes=("disabled",), source="disabled", binding="route", settled=True)
    if x.config.pinned_hedge_after_s is not None:
        return replace(
            p, value=x.config.pinned_hedge_after_s, codes=("pinned",), source="pinned", binding="route", settled=True
        )
    return p


#: Sources of a published value that no objective decision has endorsed: the route is *cold*.
COLD_SOURCES = frozenset({"default", "cold_start"})


def small_sample(p: Proposal, x: Inputs) -> Proposal:
    """Rule 2: too few samples for a confident quantile.

    A *cold* route (nothing published, or the published value is the default or an earlier
    cold-start value: ``COLD_SOURCES``) publishes the default when the samples show it within
    the budget, else the lowest value they do show within it (:func:`lowest_supported_value`;
    ``cold_start_supported``, source ``cold_start``; the route's maximum while none is, also
    with no samples at all), every tick anew, so the value comes down as the samples grow. A
    route whose value came from the objective keeps it while the samples are consistent with
    it and raises it when they show the budget exceeded (:func:`supported_value`).
    """
    if p.settled:
        return p
    estimate = x.observation.estimate
    if estimate is not None and estimate.samples >= x.knobs.min_samples and not estimate.too_few_for_budget:
        return p
    cold = x.current is None or x.current_source in COLD_SOURCES
    durations = np.asarray(x.observation.primary_durations_s, dtype=float)
    flags = np.asarray(x.observation.primary_censored, dtype=bool)
    if cold:
        return _cold_start(p, x, durations, flags)
    if estimate is None or durations.size == 0:
        return replace(p, codes=("too_few_samples",), source="controller", binding="samples", settled=True)
    value, bound = supported_value(
        durations, flags, x.config.budget, x.knobs.confidence, x.base, x.config.max_hedge_after_s
    )
    over, known = known_over(durations, flags, x.base)
    test = {"samples": int(durations.size), "known": known, "known_over": over, "lower_bound": bound}
    if value <= x.base:
        return replace(
            p, codes=("too_few_samples",), source="controller", binding="samples", settled=True,
            details=p.details | {"small_sample_test": test},
        )  # fmt: skip
    return replace(
        p.with_value(value, ("small_sample_raise",), "evidence", small_sample_test=test | {"raised_to_s": value}),
        settled=True,
    )


def _cold_start(p: Proposal, x: Inputs, durations: np.ndarray, flags: np.ndarray) -> Proposal:
    """Rule 2 on a cold route: the default when the samples support it, else the lowest value they
    support within the budget (``small_sample`` docstring)."""
    default = x.config.default_hedge_after_s
    level = cold_start_confidence(x.knobs.confidence, x.config.budget, x.knobs.min_samples)
    lowest = lowest_supported_value(
        durations, flags, x.config.budget, level, above_s=0.0, fallback_s=x.config.max_hedge_after_s
    )
    over, known = known_over(durations, flags, default)
    test = {
        "samples": int(durations.size),
        "known": known,
        "known_over": over,
        "lower_bound": binomial_lower_bound(over, known, x.knobs.confidence),
        "cold_start": True,
        "look_confidence": level,
        "lowest_supported_s": lowest,
    }
    if lowest <= default:
        return replace(
            p, value=default, codes=("too_few_samples",), source="default", binding="samples", settled=True,
            details=p.details | {"small_sample_test": test},
        )  # fmt: skip
    return replace(
        p.with_value(lowest, ("cold_start_supported",), "budget", small_sample_test=test),
        source="cold_start",
        settled=True,
    )
