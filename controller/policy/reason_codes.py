"""The reason codes a policy decision can carry (``Decision.reason``) and what each means.

``Decision.reason`` is comma-separated, main code first. :data:`REASON_MEANINGS` gives each code
a one-line meaning for operators (the route page's legend and tooltips, ``hedgerow routes show``
and ``history``); ``hedgerow.controller.policy.policy`` documents the rules that set them. The set lives
here, in a module that imports nothing beyond the standard library, so that callers which only
validate or explain a code (``hedgerow routes history --reason``, the ops pages) do not load
numpy and scipy with the policy.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["REASON_CODES", "REASON_MEANINGS", "SOURCE_MEANINGS", "explain_reason", "reason_legend"]

#: Every code ``policy.decide`` can put in ``Decision.reason`` (and ``config``, ``archived`` and
#: ``restored``, set by ``routes_admin`` when an operator changed the route), with its meaning.
#: "(modifier)" codes follow a main code; "(flag)" codes mark a route worth a look.
REASON_MEANINGS: dict[str, str] = {
    "disabled": "the route is disabled: its current value (or default) is kept",
    "pinned": "an operator pinned the value: published as is",
    "too_few_samples": "too few samples for a confident quantile; they are consistent with the value, so it is kept",
    "cold_start_supported": (
        "a new route without enough samples to support its default within the budget: the lowest value they"
        " support is published (the route's maximum, i.e. no hedging, until about 36 samples at a 10% budget)"
    ),
    "small_sample_raise": (
        "too few samples for a quantile, but they show the budget exceeded: raised to what they support"
    ),
    "censored_raise": "the budget's quantile lies where primaries were cancelled: moved to the lowest supported value",
    "censored_hold": "the budget's quantile is censored above what the data can inform: held",
    "budget_bound": "the objective's value, at the budget's edge (a lower one would risk the budget)",
    "tail_min": "the objective's value, where the predicted tail TTFT is lowest",
    "cost_tie": "the objective's value: the fewest hedges whose predicted tail is within the tolerance of the lowest",
    "replay_hold": "the objective would raise on a bucket-limited prediction, which favours raises: held",
    "raise_over_budget": "the last minutes show the value over budget (binomial bound): raised",
    "hysteresis_hold": (
        "the value is within the budget and the data do not show a better one, or none lower that stays within"
        " the budget over the tick's repeated looks at its window: held"
    ),
    "step_down_limited": (
        "(modifier) a decrease was cut to the largest step allowed per tick (details.binding step_down), or to the"
        " lowest value that stays within the budget over the tick's repeated looks at its window (binding looks)"
    ),
    "clamped_min": "(modifier) the value is at the route's min_hedge_after_s",
    "clamped_max": "(modifier) the value is at the route's max_hedge_after_s (at that bound hedging is in effect off)",
    "drift_window": "(modifier) the window was shrunk to the data since a detected change of the primary's TTFT",
    "backups_rarely_win": "(flag) backups win rarely: they may share the primary's queue",
    "hedges_did_not_lower_p99": "(flag) the calls' P99 TTFT is not clearly below the primary's: hedging is not helping",
    "config": "an operator changed the route's configuration; the decision's codes follow",
    "archived": "an operator archived the route: no longer ticked nor published, its records refused",
    "restored": "an operator restored the archived route: ticked and published again",
}

#: Every code of :data:`REASON_MEANINGS`.
REASON_CODES: frozenset[str] = frozenset(REASON_MEANINGS)

#: What each ``thresholds.source`` means, for operators.
SOURCE_MEANINGS: dict[str, str] = {
    "controller": "set by the controller's objective from the measured TTFT",
    "cold_start": "a new route: the lowest value its few samples support (the maximum, no hedging, until enough)",
    "default": "the route's default, supported by its samples",
    "pinned": "pinned by an operator",
    "disabled": "the route is disabled",
    "manual": "set by an operator",
}


def explain_reason(reason: str) -> list[tuple[str, str]]:
    """Each code of a comma-separated ``reason`` with its meaning (unknown codes: ``"?"``).

    Args:
        reason: e.g. ``"cold_start_supported,clamped_max"``.

    Returns:
        ``[(code, meaning), ...]`` in the reason's order.
    """
    codes = [code.strip() for code in reason.split(",") if code.strip()]
    return [(code, REASON_MEANINGS.get(code, "?")) for code in codes]


def reason_legend(reasons: Iterable[str]) -> list[tuple[str, str]]:
    """Every code of several comma-separated reasons once, sorted, with its meaning (the legend
    under a table of decisions).

    Args:
        reasons: e.g. the ``reason`` of each history row shown.

    Returns:
        ``[(code, meaning), ...]`` sorted by code.
    """
    return sorted(dict(pair for reason in reasons for pair in explain_reason(reason)).items())
