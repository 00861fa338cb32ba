"""One threshold-history row in plain English: why the value is what it is, with the numbers.

:func:`explain_history_row` turns a history row as the api returns it (``reason``,
``details``, ``previous_hedge_after_s``, ``hedge_after_s``, ``applied``, ``samples``, ...) into
a few short sentences for operators: what happened to the value, the constraint that bound it
(the budget, the P99 objective, cost, a step limit, the window-looks bound, too few samples, a
censored region, a pin, an operator's change...), the budget target and the bounds with their
values, the predicted P99 TTFT at the old and the new value, the samples behind the decision,
any detected change of the primary's TTFT, and the flags. The route page (each history row
expands to them), ``hedgerow routes history --explain`` and the api's ``explanation`` field all
show these sentences.

The function is pure and imports only the standard library (and the code legend of
:mod:`hedgerow.controller.policy.reason_codes`), so the api, the console and the CLI can call it
without loading the policy's numerical stack. It never raises on the row's content: a row
without details (an older version's, or one whose inputs were not recorded) or with values of
unexpected types still gets a sentence per code, built from the code's meaning.

Every code of :data:`~hedgerow.controller.policy.reason_codes.REASON_CODES` has its own
sentence (:data:`EXPLAINED_CODES`); an unknown code is named as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hedgerow.controller.policy._explain_codes import EXPLAINED_CODES, EXPLAINERS
from hedgerow.controller.policy._explain_row import (
    Row,
    _count,
    _mapping,
    _number,
    _percent,
    _plural,
    _seconds,
    _span,
    parse_row,
)
from hedgerow.controller.policy.reason_codes import REASON_MEANINGS

__all__ = ["EXPLAINED_CODES", "explain_history_row"]

#: The reason codes that carry details of the objective (rule 3) worth summarising once per row.
_OBJECTIVE_CODES = frozenset(
    {"budget_bound", "tail_min", "cost_tie", "replay_hold", "hysteresis_hold", "step_down_limited"}
)
#: Codes whose sentence is added after the others (a note on the window, then the flags).
_LATE_CODES = ("drift_window", "backups_rarely_win", "hedges_did_not_lower_p99")
#: Codes of an operator's action: the row is not a controller decision of its own.
_OPERATOR_CODES = frozenset({"config", "archived", "restored"})


def _headline(r: Row) -> str | None:
    """What happened to the value."""
    if r.codes and r.codes[0] in ("archived", "restored"):
        return None
    if r.value_s is None:
        return None
    if r.previous_s is None:
        return f"First published value: {_seconds(r.value_s)}." if r.applied else f"Value: {_seconds(r.value_s)}."
    if r.value_s != r.previous_s:
        direction = "down" if r.value_s < r.previous_s else "up"
        change = ""
        if r.previous_s > 0:
            ratio = r.value_s / r.previous_s
            change = f" ({ratio:.3g} times as high)" if ratio >= 2 else f" ({(ratio - 1) * 100:+.3g}%)"
        return f"The value went {direction} from {_seconds(r.previous_s)} to {_seconds(r.value_s)}{change}."
    if r.applied:
        return f"The published threshold changed (its enabled flag); the value stayed at {_seconds(r.value_s)}."
    again = "" if r.repeats <= 1 else f" This hold stands for {_plural(r.repeats, 'tick')}."
    return f"The value was held at {_seconds(r.value_s)}.{again}"


def _objective_sentences(r: Row) -> list[str]:
    """The predicted tail at the old and the new value, and the budget target with its bounds."""
    o = r.objective
    if not o:
        return []
    out = []
    q = r.quantile
    chosen = r.objective_s("chosen_s")
    at_current, at_chosen = r.objective_s("predicted_tail_at_current_s"), r.objective_s("predicted_tail_at_chosen_s")
    lowest = r.objective_s("predicted_min_tail_s")
    old = "the value in force" if r.previous_s is None else _seconds(r.previous_s)
    parts = []
    if at_current is not None:
        parts.append(f"{_seconds(at_current)} at {old}")
    same = chosen is not None and r.previous_s is not None and math.isclose(chosen, r.previous_s, rel_tol=1e-3)
    if at_chosen is not None and chosen is not None and not (same and at_current is not None):
        which = (
            "the new value" if r.value_s is not None and math.isclose(chosen, r.value_s) else "the objective's choice"
        )
        parts.append(f"{_seconds(at_chosen)} at {which} {_seconds(chosen)}")
    if lowest is not None and (at_chosen is None or not math.isclose(lowest, at_chosen)):
        parts.append(f"lowest {_seconds(lowest)}")
    if parts:
        out.append(f"Predicted {q} TTFT: {', '.join(parts)}.")
    target = r.objective_s("budget_target_s")
    if target is not None:
        budget = "Budget" if r.budget is None else f"Budget {_percent(r.budget)}"
        sentence = (
            f"{budget}: the budget target, the lowest value whose hedge rate is within it with confidence, is"
            f" {_seconds(target)}"
        )
        rates = []
        for key, at in (("current", old), ("chosen", None if chosen is None or same else _seconds(chosen))):
            rate, upper = r.objective_s(f"hedge_rate_at_{key}"), r.objective_s(f"hedge_rate_upper_at_{key}")
            if at is not None and rate is not None:
                bound = "" if upper is None else f" (upper bound {_percent(upper)})"
                rates.append(f"{_percent(rate)} at {at}{bound}")
        if rates:
            sentence += f"; hedge rate read off the curve: {', '.join(rates)}"
        out.append(sentence + ".")
    return out


def _samples_sentence(r: Row) -> str | None:
    """The samples behind the decision."""
    if r.samples is None or (r.samples == 0 and r.window_s is None):
        return None
    censored = "" if not r.censored else f" ({r.censored:,} censored: cancelled before a first token)"
    over = "" if r.window_s is None else f" over the last {_span(r.window_s)}"
    sentence = f"Samples: {r.samples:,} primary TTFT{'' if r.samples == 1 else 's'}{censored}{over}"
    if r.hedge_rate is not None:
        sentence += f"; hedge rate {_percent(r.hedge_rate)}"
    short = _mapping(r.details.get("short_window"))
    calls, span = _count(short.get("calls")), _number(short.get("window_s"))
    if calls is not None and span is not None:
        sentence += f"; {_plural(calls, 'call')} in the last {_span(span)}"
    return sentence + "."


def _code_sentence(code: str, r: Row) -> str:
    explainer = EXPLAINERS.get(code)
    if explainer is None:
        return f"{code}: a reason code this version does not know."
    try:
        return explainer(r)
    except Exception:  # a row of unexpected shape: the code's meaning, never an error page
        return f"{code}: {REASON_MEANINGS[code]}."


def explain_history_row(row: Mapping[str, Any]) -> list[str]:
    """The plain-English sentences of one threshold-history row, with the numbers and units.

    In order: what happened to the value (``The value went down from 30 s to 3.311 s (-89%).``),
    an operator's action (``config``, ``archived``, ``restored``), one sentence per decision
    code in the row's order naming the binding constraint and its numbers, the predicted
    P99 TTFT at the old and the new value and the budget target with the hedge rate's bounds
    (rows of the objective), the detected change (``drift_window``), the samples behind the
    decision, then the flags.

    Args:
        row: a history row as the api returns it
            (:func:`hedgerow.controller.store.queries.history_row_dict`): ``reason``,
            ``details``, ``previous_hedge_after_s`` and ``hedge_after_s`` (seconds),
            ``applied``, ``repeats``, ``budget`` (a fraction), ``samples``, ``censored``,
            ``window_s`` (seconds), ``observed_hedge_rate``, ``backup_win_rate``, ``actor``.
            Missing keys and values of unexpected types are tolerated.

    Returns:
        The sentences, at least one (``No reason was recorded.`` for a row without codes).
    """
    r = parse_row(row if isinstance(row, Mapping) else {})
    sentences: list[str] = []
    headline = _headline(r)
    if headline is not None:
        sentences.append(headline)
    if not r.codes:
        sentences.append("No reason was recorded.")
    early = [code for code in r.codes if code not in _LATE_CODES]
    sentences.extend(_code_sentence(code, r) for code in early)
    if any(code in _OBJECTIVE_CODES for code in r.codes):
        sentences.extend(_objective_sentences(r))
    late = [code for code in _LATE_CODES if code in r.codes]
    if "drift_window" in late:
        sentences.append(_code_sentence("drift_window", r))
    if not (r.codes and r.codes[0] in ("archived", "restored")):
        samples = _samples_sentence(r)
        if samples is not None:
            sentences.append(samples)
    sentences.extend(_code_sentence(code, r) for code in late if code != "drift_window")
    return sentences
