"""The policy rules' shared types: what every rule reads (:class:`Inputs`) and the value
under way through them (:class:`Proposal`). Behind the facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hedgerow.controller.policy.policy import Observation, PolicyKnobs, RouteConfig

__all__ = [
    "Inputs",
    "Proposal",
]


@dataclass(frozen=True, slots=True)
class Inputs:
    """What every rule may read.

    Attributes:
        config: the route's configuration.
        current: the published value, seconds, or None.
        base: ``current``, or the default when nothing was published, seconds.
        observation: the tick's observation (its estimate was computed with ``config.budget``).
        knobs: the policy knobs.
        current_source: who set ``current`` (``thresholds.source``), or None.
    """

    config: RouteConfig
    current: float | None
    base: float
    observation: Observation
    knobs: PolicyKnobs
    current_source: str | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """The value under way through the rules.

    Attributes:
        value: seconds.
        codes: reason codes so far, main one first.
        source: ``controller``, ``cold_start``, ``default``, ``pinned`` or ``disabled``.
        binding: the constraint that set the value: ``route`` (pinned/disabled), ``samples``
            (too few, value kept), ``evidence`` (a binomial bound showed the budget exceeded),
            ``censored`` (left a censored region), ``budget`` (the objective's budget
            constraint, or on a cold route the binomial bound's lowest supported value),
            ``tail`` (the objective's minimum), ``cost`` (the fewest hedges within the tail
            tolerance), ``replay`` (a bucket-limited search's higher value not
            followed), ``hysteresis``, ``step_down``, ``looks`` (a decrease held or cut at the
            window-looks bound, ``looks_target``), ``min`` or ``max`` (the bounds).
        settled: True once a rule fixed the value so that the search rules are skipped
            (pinned, disabled, small samples).
        details: machine-readable inputs of the rules that acted.
    """

    value: float
    codes: tuple[str, ...]
    source: str
    binding: str
    settled: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def with_value(self, value: float, codes: tuple[str, ...], binding: str, **details: Any) -> Proposal:
        """A copy with a new value, codes and binding constraint, and more details."""
        return replace(self, value=float(value), codes=codes, binding=binding, details=self.details | details)
