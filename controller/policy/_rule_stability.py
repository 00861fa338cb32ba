"""Rule 5 of the policy: hold a current value as good as the proposal, cut a decrease at the
window-looks bound and at the step limit, skip tiny changes. Behind the facade
:mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from typing import Any

from hedgerow.controller.policy._rule_evidence import short_window_over
from hedgerow.controller.policy._rule_types import Inputs, Proposal

__all__ = [
    "stability",
]


def _tail_not_shown_worse(p: Proposal, x: Inputs) -> bool:
    """True when the data do not show the current value's predicted tail worse than the proposal's.

    Both predictions rest on the same primary samples, so they are compared at the same level:
    where the true ``q`` quantile lies among the ``n`` samples is uncertain within the band of
    ``quantile_level_band(n, q, confidence)``, and the current value is shown worse only when
    its predicted quantile is more than ``p99_tolerance`` above the proposal's at every level
    of that band (``details["objective"]["predicted_tail_at_*_by_level_s"]``). The band
    narrows with the samples, so with many the test is the point comparison with the
    tolerance: at P99 and 95%, 160 samples compare the two at P97.5, P99 and P99.7; 10,000 at
    P98.83, P99 and P99.16.
    """
    od = p.details["objective"]
    current = od["predicted_tail_at_current_by_level_s"]
    chosen = od["predicted_tail_at_chosen_by_level_s"]
    for cur, new in zip(current, chosen, strict=True):
        if new is None:
            return True  # the proposal's tail is unidentified there: nothing shows the current worse
        if cur is not None and cur <= (1.0 + x.knobs.p99_tolerance) * new + 1e-12:
            return True
    return False


def _worse_at_quantile(objective_details: dict[str, Any], tolerance: float) -> bool:
    """True when the current value's predicted tail quantile exceeds the proposal's by more than
    ``tolerance`` (relative) at the quantile itself (an unidentified one counts as infinite)."""
    current = objective_details["predicted_tail_at_current_s"]
    chosen = objective_details["predicted_tail_at_chosen_s"]
    if chosen is None:
        return False
    return current is None or current > (1.0 + tolerance) * chosen + 1e-12


def _within_target_noise(value_s: float, objective_details: dict[str, Any]) -> bool:
    """True when ``value_s`` lies no further above the budget target than the target lies above
    the KM budget quantile (the point estimate that the target bounds)."""
    target = objective_details["budget_target_s"]
    point = objective_details.get("budget_quantile_s")
    if point is None or target is None:
        return False
    return bool(value_s - target <= target - point + 1e-12)


def _cost_tie_above_search(p: Proposal, x: Inputs, objective_details: dict[str, Any]) -> Proposal:
    """After a fresh change: keep a current value above the objective's search range (at or above
    the primary's own tail quantile) that the proposal does not beat at the quantile by more than
    the tolerance, as ``cost_tie`` (binding ``cost``), when it is within the budget.

    Rule 3 caps its search at the primary's tail quantile ``x_q`` because every value above it
    predicts the same tail, ``x_q``; its cost tie-break (the largest value within the tolerance of
    the lowest tail) therefore picks among values at or below ``x_q`` and leaves the comparison
    with a value above it to this rule. That comparison is no incumbent's hold: the new regime's
    own curves predict the same tail for both, and the higher value hedges less. Without it a
    fresh change would start hedging at ``x_q`` with no predicted gain (30 s to 0.294 s, both
    predicting 0.294 s, ``tests/controller/policy/test_policy.py``). The objective's details then
    describe the value kept (``chosen_s`` and the predictions at it), as the replay hold's do.
    Returns ``p`` unchanged when the current value is over the budget (its one-sided bound, or the
    short window).
    """
    base = x.base
    if not objective_details["current_within_budget"] or short_window_over(x, base):
        return p
    kept = objective_details | {
        "chosen_s": base,
        "predicted_tail_at_chosen_s": objective_details["predicted_tail_at_current_s"],
        "predicted_tail_at_chosen_by_level_s": objective_details["predicted_tail_at_current_by_level_s"],
        "hedge_rate_at_chosen": objective_details["hedge_rate_at_current"],
        "hedge_rate_upper_at_chosen": objective_details["hedge_rate_upper_at_current"],
    }
    return p.with_value(base, ("cost_tie",), "cost", objective=kept)


def stability(p: Proposal, x: Inputs) -> Proposal:
    """Rule 5: hold what is as good as the proposal; lower by a bounded step; skip tiny changes.

    "As good": the current value is within the budget (its one-sided upper bound on the hedge
    rate is ``<= budget`` and the short window does not show it over budget) and either its
    predicted tail is not shown worse than the proposal's (``_tail_not_shown_worse``: worse
    by more than the tolerance at every level of the quantile's band) or the proposal is a
    decrease within the budget target's sampling noise (``_within_target_noise``). Both
    predictions rest on the same samples, so they are compared at the same levels: a lower
    level of the current value against the proposal's P99 would hold a value that a slow mode
    makes worse at every level. A value above the objective's search range
    (above the primary's own tail quantile) is no candidate: it is not stepped down but left in
    one step (the step limit guards a candidate against noise), and it is not held when the
    proposal's predicted tail beats its own by more than the tolerance at the quantile itself
    (``_worse_at_quantile``). The band's lower levels cannot show that: a level whose primary
    quantile lies below the proposal predicts the same for both.
    **Window looks.** A decrease of the objective goes no lower than :func:`looks_target`
    (``step_down_limited``, binding ``looks``), and the current value is held when that lies at
    or above it (``hysteresis_hold``, binding ``looks``): the budget target is a bound for one
    look, but the tick looks every minute at a sliding window, and a value that follows the
    target down follows its dips (:func:`window_scan_ratio`). Raises are not limited, so a
    value enters at the window-looks bound (``z_scan`` 2.795 at 95%) and leaves at the kept
    value's one-sided bound (1.645): the wider gap also keeps it from cycling at the budget's
    edge. The price is a higher value where the tail is lowest at the budget's edge.
    The scenario runs behind these choices: ``docs/evaluation.md``, "Rule 5".
    Neither the holds nor the step-down limits apply while a detected change is *fresh* (it
    lies within the short window, ``drift["fresh"]``): they guard an incumbent value against
    noise, and a value set for the regime before a change that passed the log-rank test is no
    incumbent; the estimate since the change carries its own budget bound (and the window since
    the change has had few looks). A current value above the search range that the proposal
    does not beat is still kept then, as rule 3's cost tie-break (``cost_tie``,
    :func:`_cost_tie_above_search`).
    """
    if p.settled or x.current is None or p.value == x.base:
        return p
    base = x.base
    objective_details = p.details.get("objective")
    above_search = objective_details is not None and base > objective_details["search_top_s"]
    outdone = (
        objective_details is not None and above_search and _worse_at_quantile(objective_details, x.knobs.p99_tolerance)
    )
    if x.observation.drift is not None and x.observation.drift.get("fresh"):
        # the current value was set for the regime before the change: no incumbent; but one above
        # the search that the proposal does not beat is rule 3's own cost tie-break on the new data
        if objective_details is not None and above_search and not outdone and p.binding in ("budget", "tail", "cost"):
            return _cost_tie_above_search(p, x, objective_details)
        return p
    hold = p.with_value(base, ("hysteresis_hold",), "hysteresis")
    if (
        p.binding in ("budget", "tail", "cost")
        and objective_details is not None
        and not outdone
        and objective_details["current_within_budget"]
        and not short_window_over(x, base)
        and (
            _tail_not_shown_worse(p, x)  # its tail is as good
            or (p.value < base and _within_target_noise(base, objective_details))  # the decrease is noise
        )
    ):
        return hold  # the current value meets the budget and is as good as the proposal
    if p.value < base and p.binding in ("budget", "tail", "cost") and objective_details is not None:
        looks = objective_details["looks_target_s"]  # a decrease goes no lower than this
        if looks is None or looks >= base:
            return p.with_value(base, ("hysteresis_hold",), "looks")
        if p.value < looks:
            p = p.with_value(looks, (*p.codes, "step_down_limited"), "looks")
    if abs(p.value - base) / base < x.knobs.hysteresis and p.binding not in ("evidence",):
        return hold
    floor = base * (1.0 - x.knobs.max_step_down)
    if p.value < floor and not above_search:
        codes = p.codes if "step_down_limited" in p.codes else (*p.codes, "step_down_limited")
        return p.with_value(floor, codes, "step_down")
    return p
