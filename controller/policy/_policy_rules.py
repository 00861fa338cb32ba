"""The policy's rules: small functions ``(proposal, inputs) -> proposal``, applied in order.

``policy.decide`` folds :data:`RULES` over a starting proposal (the current value, or the
default); the module docstring of ``policy`` describes each rule, its codes and its numbers.
Each rule reads the estimation's curves (``TTFTEstimate.curve``, ``Observation.backup_curve``)
and never re-estimates from raw samples; the raw primary samples are read only for the
binomial counts and, in arrival order, for the hedge model's replay of the clients' bucket.

This module is the facade of the rules; each step lives in a private module of its own:

- ``_rule_types``: :class:`Inputs` (what every rule reads) and :class:`Proposal` (the value under way);
- ``_rule_settle``: rules 1 and 2, the route's state and too few samples (cold start included);
- ``_rule_objective``: rule 3, the one objective (with the replay hold and the censored region);
- ``_rule_evidence``: rule 4, the short window's evidence of over budget;
- ``_rule_stability``: rule 5, holds, the window-looks cut and the step limit;
- ``_rule_label``: rules 6 and 7, the clamp and the drift note;
- shared by them: ``_rule_binomial`` (known-over counts, Clopper-Pearson bounds, supported and
  accepted values, the cold period's level, the quantile's level band), ``_rule_spread``
  (:func:`spread_steps`, the prediction curves of minute aggregates) and ``_rule_window_looks``
  (:func:`window_scan_ratio`, :func:`looks_target`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hedgerow.controller.policy._rule_binomial import (
    binomial_lower_bound,
    binomial_upper_bound,
    cold_start_confidence,
    known_over,
    known_over_counts,
    least_accepted_value,
    lowest_supported_value,
    quantile_level_band,
    supported_value,
)
from hedgerow.controller.policy._rule_evidence import over_budget_evidence
from hedgerow.controller.policy._rule_label import clamp, drift_note
from hedgerow.controller.policy._rule_objective import objective
from hedgerow.controller.policy._rule_settle import COLD_SOURCES, route_state, small_sample
from hedgerow.controller.policy._rule_spread import SPREAD_STEPS, spread_steps
from hedgerow.controller.policy._rule_stability import stability
from hedgerow.controller.policy._rule_types import Inputs, Proposal
from hedgerow.controller.policy._rule_window_looks import looks_target, window_scan_ratio

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "COLD_SOURCES",
    "RULES",
    "SPREAD_STEPS",
    "Inputs",
    "Proposal",
    "binomial_lower_bound",
    "binomial_upper_bound",
    "clamp",
    "cold_start_confidence",
    "drift_note",
    "known_over",
    "known_over_counts",
    "least_accepted_value",
    "looks_target",
    "lowest_supported_value",
    "objective",
    "over_budget_evidence",
    "quantile_level_band",
    "route_state",
    "small_sample",
    "spread_steps",
    "stability",
    "supported_value",
    "window_scan_ratio",
]

#: The rules in the order ``decide`` applies them (``policy`` module docstring).
RULES: tuple[Callable[[Proposal, Inputs], Proposal], ...] = (
    route_state,
    small_sample,
    objective,
    over_budget_evidence,
    stability,
    clamp,
    drift_note,
)
