"""One sentence per reason code of a threshold-history row, with the numbers of its details.

:data:`EXPLAINERS` maps each code of :data:`~hedgerow.controller.policy.reason_codes.REASON_CODES`
to the function that writes its sentence from a :class:`~hedgerow.controller.policy._explain_row.Row`.
Standard library only. Behind :mod:`hedgerow.controller.policy.explain`, which orders the
sentences of a row.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hedgerow.controller.policy._explain_row import (
    Row,
    _count,
    _level,
    _mapping,
    _number,
    _percent,
    _plural,
    _seconds,
    _setting,
    _span,
)

__all__ = ["EXPLAINED_CODES", "EXPLAINERS"]


def _disabled(r: Row) -> str:
    return (
        f"The route is disabled: clients do not hedge, and the controller keeps its value ({_seconds(r.value_s)})"
        " without deciding."
    )


def _pinned(r: Row) -> str:
    return (
        f"An operator pinned the value at {_seconds(r.value_s)}: it is published as is, and the controller's rules"
        " do not apply while the pin stands."
    )


def _too_few_samples(r: Row) -> str:
    test = _mapping(r.details.get("small_sample_test"))
    n = _count(test.get("samples"))
    if n is None:
        n = r.samples
    many = "too few samples" if n is None else f"too few samples ({_plural(n, 'primary sample')})"
    if test.get("cold_start") is True:
        lowest = _number(test.get("lowest_supported_s"))
        level = _number(test.get("look_confidence"))
        support = "" if lowest is None else f"; the lowest value they support is {_seconds(lowest)}"
        at = "" if level is None else f" at {_percent(level)} confidence"
        return (
            f"A new route with {many} for a confident quantile: the samples support the default,"
            f" {_seconds(r.value_s)}, within the {r.budget_text}{at}, so it is published{support}."
        )
    over, known, bound = _count(test.get("known_over")), _count(test.get("known")), _number(test.get("lower_bound"))
    if over is None or known is None or bound is None:
        return (
            f"{many.capitalize()} for a confident quantile: the value ({_seconds(r.value_s)}) is kept while the"
            " samples are consistent with it."
        )
    return (
        f"{many.capitalize()} for a confident quantile: {over:,} of the {known:,} primaries whose wait is known"
        f" waited past {_seconds(r.value_s)}; the confidence lower bound on that share, {_percent(bound)}, is within"
        f" the {r.budget_text}, so the value is kept."
    )


def _cold_start_supported(r: Row) -> str:
    test = _mapping(r.details.get("small_sample_test"))
    n = _count(test.get("samples"))
    if n is None:
        n = r.samples
    level = _number(test.get("look_confidence"))
    at = "" if level is None else f" at {_percent(level)} confidence"
    samples = "too few samples" if n is None else f"too few samples ({_plural(n, 'primary sample')})"
    if "clamped_max" in r.codes:
        needed = ""
        if level is not None and r.budget is not None and 0 < r.budget < 1 and 0 < level < 1 and n is not None:
            # k = 0 of n past a value is shown within the budget once 1 - (1 - level) ** (1 / n) <= budget
            least = math.ceil(math.log1p(-level) / math.log1p(-r.budget) - 1e-9)
            if n < least <= 10**6:  # a count an operator can act on
                needed = f" (with none slow, about {least} samples are needed)"
        return (
            f"A new route with {samples} for a confident quantile: no value below the route's maximum is shown"
            f" within the {r.budget_text}{at} yet{needed}, so the maximum, {_seconds(r.value_s)}, is published."
        )
    return (
        f"A new route with {samples} for a confident quantile: the default is not shown within the {r.budget_text};"
        f" the lowest value the samples support{at}, {_seconds(r.value_s)}, is published."
    )


def _small_sample_raise(r: Row) -> str:
    test = _mapping(r.details.get("small_sample_test"))
    over, known, bound = _count(test.get("known_over")), _count(test.get("known")), _number(test.get("lower_bound"))
    raised = _number(test.get("raised_to_s"))
    if raised is None:
        raised = r.value_s
    evidence = (
        ""
        if over is None or known is None or bound is None
        else f": {over:,} of the {known:,} primaries whose wait is known waited past {_seconds(r.previous_s)}, and the"
        f" confidence lower bound on that share, {_percent(bound)}, exceeds it"
    )
    return (
        f"Too few samples for a confident quantile, but they show the {r.budget_text} exceeded{evidence};"
        f" the value was raised to {_seconds(raised)}."
    )


def _censored_raise(r: Row) -> str:
    censored = _mapping(r.details.get("censored"))
    end = _number(censored.get("max_censored_s"))
    lowest = _number(censored.get("lowest_supported_s"))
    upto = "" if end is None else f" (primaries censored up to {_seconds(end)})"
    return (
        f"The budget's quantile lies where primaries were cancelled before a first token{upto}, so no budget target"
        f" can be read; the value moved to {_seconds(lowest if lowest is not None else r.value_s)}, the lowest"
        " value the data can support."
    )


def _censored_hold(r: Row) -> str:
    censored = _mapping(r.details.get("censored"))
    end = _number(censored.get("max_censored_s"))
    upto = "" if end is None else f" up to {_seconds(end)}"
    return (
        f"The budget's quantile lies where primaries were cancelled{upto}, and the value lies above every censoring"
        " time, where the data cannot show a better one: kept."
    )


def _budget_bound(r: Row) -> str:
    target = r.objective_s("budget_target_s")
    return (
        f"Binding constraint: the {r.budget_text}. The value with the lowest predicted {r.quantile} TTFT is at the"
        f" budget target, {_seconds(target if target is not None else r.value_s)}, the lowest value whose hedge rate"
        " stays within the budget with confidence: a lower one would risk the budget."
    )


def _tail_min(r: Row) -> str:
    chosen, lowest = r.objective_s("chosen_s"), r.objective_s("predicted_min_tail_s")
    target = r.objective_s("budget_target_s")
    above = "" if target is None else f", above the budget target {_seconds(target)}"
    at = "" if lowest is None else f", {_seconds(lowest)},"
    return (
        f"Binding constraint: the {r.quantile} objective. The predicted {r.quantile} TTFT is lowest{at} at"
        f" {_seconds(chosen if chosen is not None else r.value_s)}{above}."
    )


def _cost_tie(r: Row) -> str:
    chosen, lowest = r.objective_s("chosen_s"), r.objective_s("predicted_min_tail_s")
    at_chosen, tolerance = r.objective_s("predicted_tail_at_chosen_s"), r.objective_s("tolerance")
    value = _seconds(chosen if chosen is not None else r.value_s)
    within = "" if tolerance is None else f" within the {_percent(tolerance)} tolerance of it"
    if lowest is None or at_chosen is None:
        return (
            f"Binding constraint: cost. {value} predicts a {r.quantile} TTFT{within} of the lowest, with fewer hedges,"
            " so the objective takes that higher value."
        )
    return (
        f"Binding constraint: cost. The lowest predicted {r.quantile} TTFT is {_seconds(lowest)}; {value} predicts"
        f" {_seconds(at_chosen)},{within}, with fewer hedges, so the objective takes that higher value."
    )


def _replay_hold(r: Row) -> str:
    choice = r.objective_s("search_choice_s")
    would = "" if choice is None else f" would put the value at {_seconds(choice)}, above the current one, but it"
    return (
        f"The objective's search{would} was bucket-limited (the clients' hedge bucket runs dry near the budget target);"
        f" that prediction favours raises, so the value is held at {_seconds(r.value_s)}."
    )


def _raise_over_budget(r: Row) -> str:
    test = _mapping(r.details.get("over_budget_test"))
    span = _number(_mapping(r.details.get("short_window")).get("window_s"))
    over, known, bound = _count(test.get("known_over")), _count(test.get("known")), _number(test.get("lower_bound"))
    proposed, raised = _number(test.get("value_s")), _number(test.get("raised_to_s"))
    last = "the last minutes" if span is None else f"the last {_span(span)}"
    evidence = (
        ""
        if over is None or known is None or bound is None
        else f": {over:,} of the {known:,} primaries whose wait is known waited past it, and the confidence lower"
        f" bound on that share, {_percent(bound)}, exceeds the {r.budget_text}"
    )
    value = "the proposed value" if proposed is None else f"the proposed value {_seconds(proposed)}"
    return (
        f"Binding constraint: evidence of over budget. {last.capitalize()} show {value} over budget{evidence};"
        f" it was raised to {_seconds(raised if raised is not None else r.value_s)}, the lowest value that test"
        " accepts."
    )


def _shown_worse(r: Row) -> bool | None:
    """Whether the current value's predicted tail exceeds the proposal's by more than the tolerance
    at every level of the quantile's band (rule 5's test), or None when the inputs are missing."""
    current, chosen = (
        r.objective.get("predicted_tail_at_current_by_level_s"),
        r.objective.get("predicted_tail_at_chosen_by_level_s"),
    )
    tolerance = r.objective_s("tolerance")
    if not isinstance(current, list) or not isinstance(chosen, list) or tolerance is None or not current:
        return None
    for cur, new in zip(current, chosen, strict=False):
        cur_s, new_s = _number(cur), _number(new)
        if new_s is None:
            return False
        if cur_s is not None and cur_s <= (1.0 + tolerance) * new_s + 1e-12:
            return False
    return True


def _band(r: Row) -> str:
    """The quantile band's levels: ``P97.5, P99 and P99.7``, or ''."""
    levels = r.objective.get("tail_levels")
    if not isinstance(levels, list) or not levels:
        return ""
    names = [_level(_number(level)) for level in levels]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _hysteresis_hold(r: Row) -> str:
    chosen = r.objective_s("chosen_s")
    held = f"held at {_seconds(r.value_s)}"
    if r.binding == "looks":
        looks = r.objective_s("looks_target_s")
        bound = (
            "no value below it stays within the budget over the tick's repeated looks at its window"
            if looks is None
            else f"the window-looks bound, {_seconds(looks)} (the lowest value that stays within the budget over the"
            " tick's repeated looks at its window), is at or above it"
        )
        proposal = "a decrease" if chosen is None else f"a decrease to {_seconds(chosen)}"
        return f"The objective proposed {proposal}, but {bound}: {held}."
    if not r.objective or chosen is None:
        return (
            f"The proposed change is too small to act on (under the hysteresis), or no better value is shown: {held}."
        )
    at_current, at_chosen = r.objective_s("predicted_tail_at_current_s"), r.objective_s("predicted_tail_at_chosen_s")
    upper = r.objective_s("hedge_rate_upper_at_current")
    within = r.objective.get("current_within_budget") is True
    predicted = (
        ""
        if at_current is None or at_chosen is None
        else f" (predicted {r.quantile} {_seconds(at_chosen)}, against {_seconds(at_current)} at the current value)"
    )
    proposal = f"The objective proposed {_seconds(chosen)}{predicted}"
    if within and _shown_worse(r) is False:
        bound = "" if upper is None else f" (hedge rate upper bound {_percent(upper)})"
        tolerance = r.objective_s("tolerance")
        margin = "" if tolerance is None else f" by more than the {_percent(tolerance)} tolerance"
        band = _band(r)
        levels = f" at every level of {band}" if band else ""
        return (
            f"{proposal}; the current value is within the {r.budget_text}{bound} and the data do not show it"
            f" worse{margin}{levels}, so it is {held}."
        )
    if within and r.previous_s is not None and chosen < r.previous_s:
        target, point = r.objective_s("budget_target_s"), r.objective_s("budget_quantile_s")
        noise = (
            ""
            if target is None or point is None
            else f" (the current value is no further above the budget target {_seconds(target)} than the target lies"
            f" above the measured budget quantile {_seconds(point)})"
        )
        return f"{proposal}; that decrease lies within the budget target's own sampling noise{noise}: {held}."
    change = "" if r.previous_s is None or r.previous_s <= 0 else f" ({(chosen / r.previous_s - 1) * 100:+.1f}%)"
    return f"{proposal}; the change{change} is too small to act on (under the hysteresis): {held}."


def _step_down_limited(r: Row) -> str:
    chosen, looks = r.objective_s("chosen_s"), r.objective_s("looks_target_s")
    chose = "" if chosen is None else f" (the objective chose {_seconds(chosen)})"
    if r.binding == "looks":
        return (
            f"The decrease was cut to {_seconds(r.value_s)}, the window-looks bound: the lowest value whose hedge rate"
            f" stays within the {r.budget_text} over the tick's repeated looks at its window, not only at one"
            f"{chose}."
        )
    step = ""
    if r.previous_s and r.value_s is not None and r.value_s < r.previous_s:
        step = f", {(1 - r.value_s / r.previous_s) * 100:.3g}% below {_seconds(r.previous_s)}"
    also = (
        "" if looks is None or chosen is None or looks <= chosen else f"; the window-looks bound is {_seconds(looks)}"
    )
    return f"The decrease was cut to {_seconds(r.value_s)}, the largest step down allowed per tick{step}{chose}{also}."


def _clamped_min(r: Row) -> str:
    return f"The value is at the route's minimum (min_hedge_after_s), {_seconds(r.value_s)}."


def _clamped_max(r: Row) -> str:
    return (
        f"The value is at the route's maximum (max_hedge_after_s), {_seconds(r.value_s)}: at that bound hedging is in"
        " effect off."
    )


def _drift_window(r: Row) -> str:
    drift = _mapping(r.details.get("drift"))
    since = _number(drift.get("since_s"))
    ago = "" if since is None else f" {_span(since)} ago"
    fresh = (
        " The change is recent (within the short window), so the hold and the step limits do not apply: the old"
        " value belonged to the regime before it."
        if drift.get("fresh") is True
        else ""
    )
    if fresh and r.codes and r.codes[0] == "cost_tie" and r.value_s is not None and r.value_s == r.previous_s:
        fresh += " It is kept because the data since the change predict the same tail there, with fewer hedges."
    if drift.get("test") == "tail":
        level = _number(drift.get("level_s"))
        counts = [_count(drift.get(key)) for key in ("recent_over", "recent_known", "older_over", "older_known")]
        p_value = _number(drift.get("p_value"))
        evidence = ""
        if None not in counts:
            evidence = (
                f": since then {counts[0]:,} of {counts[1]:,} primaries passed {_seconds(level)}"
                f" (the older part's tail), against {counts[2]:,} of {counts[3]:,} before"
            )
            if p_value is not None:
                evidence += f" (Fisher p = {p_value:.2g})"
        return (
            f"The primary's tail recovered from a queue{ago}{evidence}; the window was shrunk to the data since"
            f" then.{fresh}"
        )
    ratio, p_value = _number(drift.get("median_ratio")), _number(drift.get("p_value"))
    recent, older = _count(drift.get("recent_samples")), _count(drift.get("older_samples"))
    evidence = ""
    if ratio is not None:
        evidence = f": the median TTFT since then is {ratio:.3g} times the median before"
        facts = [f"log-rank p = {p_value:.2g}"] if p_value is not None else []
        if recent is not None and older is not None:
            facts.append(f"{recent:,} samples since, {older:,} before")
        evidence += f" ({'; '.join(facts)})" if facts else ""
    return (
        f"A change of the primary's TTFT was detected{ago}{evidence}; the window was shrunk to the data since the"
        f" change.{fresh}"
    )


def _backups_rarely_win(r: Row) -> str:
    hedges = _count(_mapping(r.details.get("p99_check")).get("hedges"))
    of = "" if hedges is None else f" of {_plural(hedges, 'hedge')}"
    rate = "rarely" if r.backup_win_rate is None else f"only {_percent(r.backup_win_rate)}{of}"
    return f"Flag: backups won {rate}; the backup probably shares the primary's queue."


def _hedges_did_not_lower_p99(r: Row) -> str:
    check = _mapping(r.details.get("p99_check"))
    call, primary = _number(check.get("call_p99_s")), _number(check.get("primary_p99_s"))
    improvement, limit = _number(check.get("min_p99_improvement")), _number(check.get("limit_s"))
    if call is None or primary is None:
        return "Flag: the calls' P99 TTFT is not clearly below the primary's: hedging is not lowering the tail."
    by = "" if improvement is None else f" {_percent(improvement)}"
    under = "" if limit is None else f" (it would need to be under {_seconds(limit)})"
    return (
        f"Flag: the calls' P99 TTFT, {_seconds(call)}, is not{by} below the primary's P99, {_seconds(primary)}{under}:"
        " hedging is not lowering the tail."
    )


def _who(r: Row) -> str:
    """Who made an operator's change, to start a sentence."""
    return r.actor if r.actor_named else "An operator"


def _config(r: Row) -> str:
    changes = _mapping(r.details.get("changes"))
    parts = []
    for name, change in changes.items():
        step = _mapping(change)
        parts.append(f"{name} {_setting(str(name), step.get('from'))} → {_setting(str(name), step.get('to'))}")
    if r.details.get("created") is True:
        return f"{_who(r)} created the route; its first value was decided at once."
    listed = f" ({'; '.join(parts)})" if parts else ""
    return f"{_who(r)} changed the route's configuration{listed}; the value was decided again at once."


def _archived(r: Row) -> str:
    return (
        f"{_who(r)} archived the route: it is no longer ticked nor published, and records naming it are refused;"
        " its history is kept."
    )


def _restored(r: Row) -> str:
    return f"{_who(r)} restored the archived route: it is ticked and published again."


EXPLAINERS: dict[str, Callable[[Row], str]] = {
    "disabled": _disabled,
    "pinned": _pinned,
    "too_few_samples": _too_few_samples,
    "cold_start_supported": _cold_start_supported,
    "small_sample_raise": _small_sample_raise,
    "censored_raise": _censored_raise,
    "censored_hold": _censored_hold,
    "budget_bound": _budget_bound,
    "tail_min": _tail_min,
    "cost_tie": _cost_tie,
    "replay_hold": _replay_hold,
    "raise_over_budget": _raise_over_budget,
    "hysteresis_hold": _hysteresis_hold,
    "step_down_limited": _step_down_limited,
    "clamped_min": _clamped_min,
    "clamped_max": _clamped_max,
    "drift_window": _drift_window,
    "backups_rarely_win": _backups_rarely_win,
    "hedges_did_not_lower_p99": _hedges_did_not_lower_p99,
    "config": _config,
    "archived": _archived,
    "restored": _restored,
}

#: Every code that has a sentence of its own (the test checks it is every code of ``REASON_CODES``).
EXPLAINED_CODES: frozenset[str] = frozenset(EXPLAINERS)
