"""Rules 6 and 7 of the policy: clamp to the route's bounds (and label a value at a bound), note a
window shrunk to the data since a detected change. Behind the facade
:mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from dataclasses import replace

from hedgerow.controller.policy._rule_types import Inputs, Proposal

__all__ = [
    "clamp",
    "drift_note",
]


def clamp(p: Proposal, x: Inputs) -> Proposal:
    """Rule 6: clamp controller values to the route's bounds; label a value at a bound.

    A new controller value is published at a resolution of 0.1 ms (``round(value, 4)``): the
    search's grid points carry 16 digits of binary noise that no client timer resolves, and a
    value with a short decimal form reads the same from every endpoint and in the history.
    """
    if p.source in ("pinned", "disabled"):
        return p
    if p.value != x.base:
        p = replace(p, value=round(p.value, 4))
    low, high = x.config.min_hedge_after_s, x.config.max_hedge_after_s
    if p.value <= low:
        codes = p.codes if "clamped_min" in p.codes else (*p.codes, "clamped_min")
        return replace(p, value=low, codes=codes, binding="min" if p.value < low else p.binding)
    if p.value >= high:
        codes = p.codes if "clamped_max" in p.codes else (*p.codes, "clamped_max")
        return replace(p, value=high, codes=codes, binding="max" if p.value > high else p.binding)
    return p


def drift_note(p: Proposal, x: Inputs) -> Proposal:
    """Rule 7: say when the window was shrunk to the data since a detected change."""
    if x.observation.drift is None or p.source in ("pinned", "disabled"):
        return p
    return replace(p, codes=(*p.codes, "drift_window"), details=p.details | {"drift": x.observation.drift})
