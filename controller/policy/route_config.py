"""A route's stored configuration (:class:`RouteConfig`) and the range checks it shares with the policy.

Kept apart from :mod:`hedgerow.controller.policy.policy` so that ingest, which creates routes with their
defaults, and route administration read it without loading the estimation stack (numpy's
survival code and scipy): this module imports the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RouteConfig", "check_count", "check_fraction", "check_positive", "is_number"]


def is_number(value: Any) -> bool:
    """True for a real int/float (bool excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a finite number > 0."""
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_fraction(name: str, value: Any, *, low_open: bool, high_open: bool) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is in the given interval of [0, 1]."""
    ok = is_number(value) and math.isfinite(value)
    if ok:
        ok = (value > 0 if low_open else value >= 0) and (value < 1 if high_open else value <= 1)
    if not ok:
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def check_count(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """One (route, model)'s configuration as stored in the ``routes`` table.

    Attributes:
        enabled: hedging on for this route; a disabled route's value is never changed.
        budget: largest allowed fraction of calls that hedge, in (0, 1).
        default_hedge_after_s: the value a cold route publishes while its samples support it
            within the budget, seconds (rule 2; with fewer, the lowest value they support,
            the maximum while none is).
        min_hedge_after_s / max_hedge_after_s: bounds of the controller's value, seconds.
        pinned_hedge_after_s: operator override published as is, seconds; ``None`` when unset.

    Raises:
        ValueError: a field out of range (named in the message), or min > max.
    """

    enabled: bool = True
    budget: float = 0.10
    default_hedge_after_s: float = 2.0
    min_hedge_after_s: float = 0.05
    max_hedge_after_s: float = 30.0
    pinned_hedge_after_s: float | None = None

    def __post_init__(self) -> None:
        check_fraction("budget", self.budget, low_open=True, high_open=True)
        check_positive("default_hedge_after_s", self.default_hedge_after_s)
        check_positive("min_hedge_after_s", self.min_hedge_after_s)
        check_positive("max_hedge_after_s", self.max_hedge_after_s)
        if self.min_hedge_after_s > self.max_hedge_after_s:
            raise ValueError(
                f"min_hedge_after_s ({self.min_hedge_after_s}) exceeds max_hedge_after_s ({self.max_hedge_after_s})"
            )
        if self.pinned_hedge_after_s is not None:
            check_positive("pinned_hedge_after_s", self.pinned_hedge_after_s)
