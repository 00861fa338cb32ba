"""Rule 3 of the policy, the one objective: the threshold with the lowest predicted call tail among
those the budget bound allows (``hedge_model.efficient_threshold`` over spread curves, with the
clients' bucket replayed), the replay hold, and the way out of a censored region. Behind the
facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from hedgerow.controller.policy._rule_binomial import quantile_level_band
from hedgerow.controller.policy._rule_spread import spread_steps
from hedgerow.controller.policy._rule_types import Inputs, Proposal
from hedgerow.controller.policy._rule_window_looks import looks_target
from hedgerow.controller.policy.hedge_model import (
    BucketReplay,
    efficient_threshold,
    predicted_quantile_levels,
    win_probability,
)

if TYPE_CHECKING:
    from hedgerow.controller.policy.estimation import KMCurve, TTFTEstimate

__all__ = [
    "objective",
]


def _replay(x: Inputs) -> BucketReplay | None:
    obs = x.observation
    if x.knobs.client_budget_burst <= 0 or not obs.primary_started_s:
        return None
    order = np.argsort(np.asarray(obs.primary_started_s, dtype=float), kind="stable")
    return BucketReplay(
        durations_s=np.asarray(obs.primary_durations_s, dtype=float)[order],
        censored=np.asarray(obs.primary_censored, dtype=bool)[order],
        budget=x.config.budget,
        burst=x.knobs.client_budget_burst,
    )


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _censored_exit(estimate: TTFTEstimate, budget: float) -> float:
    """The lowest value the data can support when the budget quantile is censored, seconds.

    The KM estimate's own ``1 - budget`` quantile when the curve reaches it (Greenwood's
    variance is what keeps the upper bound, and so the target, above it), else the end of the
    censored region (the largest censoring time: beyond it the data say nothing yet); never
    below ``KMCurve.lowest_supported_s``, the first time the one-sided lower bound allows the
    budget. Calls at that value then censor less and identify the target.
    """
    if estimate.curve is None:
        return estimate.max_observed_s
    point = _primary_quantile(estimate.curve, 1.0 - budget)
    end = point if point is not None else (estimate.max_censored_s or estimate.max_observed_s)
    return max(end, estimate.curve.lowest_supported_s(budget))


def _primary_quantile(curve: KMCurve, q: float) -> float | None:
    """The primary's KM quantile ``q`` (first first-token time with ``S <= 1 - q``), or None."""
    reached = np.flatnonzero(curve.event & (curve.survival <= 1.0 - q + 1e-12))
    return float(curve.times_s[reached[0]]) if reached.size else None


def objective(p: Proposal, x: Inputs) -> Proposal:
    """Rule 3: minimise the predicted tail subject to the budget bound; leave censored regions."""
    if p.settled:
        return p
    estimate = x.observation.estimate
    assert estimate is not None  # small_sample settles every proposal without an estimate
    curve = estimate.curve
    budget = x.config.budget
    target = estimate.target_s
    if target is None:
        supported = _censored_exit(estimate, budget)
        censored = {"lowest_supported_s": supported, "max_censored_s": estimate.max_censored_s}
        below_censoring = estimate.max_censored_s is not None and x.base <= estimate.max_censored_s
        if below_censoring and supported > x.base:
            return p.with_value(supported, ("censored_raise",), "censored", censored=censored)
        return p.with_value(x.base, ("censored_hold",), "censored", censored=censored)
    assert curve is not None  # a target exists only where a first token was seen
    measured = curve.survival_curve()  # the hedge rates read off it; the predictions spread it
    primary = spread_steps(measured)
    backup = None if x.observation.backup_curve is None else spread_steps(x.observation.backup_curve)
    g = backup if backup is not None else primary
    low = max(target, x.config.min_hedge_after_s)
    top = max(x.config.max_hedge_after_s, low)
    q = x.knobs.tail_quantile
    # Above the primary's own tail quantile x_q every threshold predicts the same tail, x_q
    # (the call is the primary alone up to the threshold), so the minimum over [low, max] is
    # reached in [low, x_q] and the cost tie-break stops there instead of running to the max.
    primary_tail_s = _primary_quantile(curve, q)
    if primary_tail_s is not None:
        top = max(low, min(top, primary_tail_s))
    replay = _replay(x)
    choice = efficient_threshold(primary, backup, low, top, tolerance=x.knobs.p99_tolerance, q=q, replay=replay)
    value = choice.hedge_after_s
    # A bucket-limited search that puts its best value above the current one rests on the
    # replay's one-sided error (``hedge_model``: the replay holds the primaries as observed
    # under the current value, so it cannot see that a lower threshold drains an overloaded
    # upstream's queue, nor that a higher one lets it grow; both favour higher thresholds).
    # Its prediction is self-consistent only at the current value, which is therefore kept.
    replay_hold = choice.bucket_limited and x.current is not None and low <= x.base < value
    if replay_hold:
        value = x.base
        code, binding = "replay_hold", "replay"
    elif math.isclose(value, low):
        code, binding = ("budget_bound", "budget") if low == target else ("clamped_min", "min")
    elif choice.p99_at_choice_s <= choice.min_p99_s + 1e-12:
        code, binding = "tail_min", "tail"
    else:
        code, binding = "cost_tie", "cost"
    levels = quantile_level_band(curve.samples, q, x.knobs.confidence)
    # (levels, 2): the current value's and the choice's predicted tail at each level
    paired = predicted_quantile_levels(primary, g, np.array([x.base, value]), levels, replay)
    at_current = float(paired[levels.index(q), 0])  # the band always holds q itself
    rate_upper_at_current = float(curve.upper_one_sided_at(x.base))
    details: dict[str, Any] = {
        "objective": {
            "quantile": q,
            "budget_target_s": target,
            "budget_quantile_s": _primary_quantile(curve, 1.0 - budget),
            "looks_target_s": looks_target(curve, budget, x.knobs.confidence),
            "search_low_s": low,
            "search_top_s": top,
            "bucket_limited": choice.bucket_limited,
            "search_choice_s": choice.hedge_after_s,
            "primary_tail_s": primary_tail_s,
            "chosen_s": value,
            "predicted_tail_at_chosen_s": _finite(at_current if replay_hold else choice.p99_at_choice_s),
            "predicted_min_tail_s": _finite(choice.min_p99_s),
            "predicted_tail_at_budget_target_s": _finite(choice.p99_at_budget_s),
            "predicted_tail_at_current_s": _finite(at_current),
            "tail_levels": list(levels),
            "predicted_tail_at_current_by_level_s": [_finite(v) for v in paired[:, 0]],
            "predicted_tail_at_chosen_by_level_s": [_finite(v) for v in paired[:, 1]],
            "hedge_rate_at_current": float(measured(x.base)),
            "hedge_rate_upper_at_current": rate_upper_at_current,
            "current_within_budget": rate_upper_at_current <= budget + 1e-12,
            "hedge_rate_at_chosen": float(measured(value)),
            "hedge_rate_upper_at_chosen": float(curve.upper_at(value)),
            "win_probability_at_chosen": (
                win_probability(primary, g, value) if replay_hold else choice.win_probability_at_choice
            ),
            "backup_curve": choice.backup_source,
            "bucket_replay": replay is not None,
            "tolerance": x.knobs.p99_tolerance,
        }
    }
    return p.with_value(value, (code,), binding, **details)
