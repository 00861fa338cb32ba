"""A threshold-history row as the explanations read it, and the way they write numbers.

:func:`parse_row` reads a history row as the api returns it into a :class:`Row` whose fields are
None when missing or malformed (never raising); the readers (``_number``, ``_count``,
``_mapping``) and writers (``_seconds``, ``_span``, ``_percent``, ``_level``, ``_plural``,
``_setting``) here are the ones every sentence uses. Standard library only. Behind
:mod:`hedgerow.controller.policy.explain`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "parse_row"]


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, a bool, a string, NaN, infinite)."""
    kind = type(value)  # exact types: a bool is no number here, and JSON gives only int and float
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value) if abs(value) < 2**1023 else None  # beyond it float() overflows
    return None


def _count(value: Any) -> int | None:
    """``value`` as a non-negative int, or None."""
    number = _number(value)
    return int(number) if number is not None and number >= 0 and number == int(number) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _seconds(value: float | None) -> str:
    """A duration in seconds for a sentence: ``0.166 s``, ``3.311 s``, ``30 s``, ``1,800 s``."""
    if value is None:
        return "an unknown value"
    if abs(value) >= 1000:
        return f"{value:,.0f} s"
    if abs(value) >= 1:
        return f"{value:.4g} s"
    return f"{value:.3g} s"


def _span(value: float | None) -> str:
    """A window's length for a sentence: ``90 s``, ``5 min``, ``4 h``, ``2 d``."""
    if value is None:
        return "an unknown span"
    if value < 120:
        return f"{value:.3g} s"
    if value < 7200:
        return f"{value / 60:.3g} min"
    if value < 172800:
        return f"{value / 3600:.3g} h"
    return f"{value / 86400:.3g} d"


def _percent(value: float | None) -> str:
    """A rate or a budget in percent: ``8.47%``, ``10%``."""
    return "an unknown share" if value is None else f"{value * 100:.3g}%"


def _level(quantile: float | None) -> str:
    """A quantile's name: 0.99 -> ``P99``, 0.995 -> ``P99.5``."""
    return "P99" if quantile is None or not 0 < quantile < 1 else f"P{quantile * 100:.4g}"


def _plural(count: int, noun: str) -> str:
    """``1 tick``, ``23 ticks``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _setting(name: str, value: Any) -> str:
    """One route setting's value as an operator reads it (budget in percent, durations in s)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    number = _number(value)
    if number is not None:
        return _percent(number) if name == "budget" else _seconds(number)
    text = str(value)
    return text if len(text) <= 40 else text[:39] + "…"


@dataclass(frozen=True, slots=True)
class Row:
    """The fields of a history row the sentences read, each None when missing or malformed."""

    codes: tuple[str, ...]
    details: Mapping[str, Any]
    previous_s: float | None
    value_s: float | None
    applied: bool
    repeats: int
    budget: float | None
    samples: int | None
    censored: int | None
    window_s: float | None
    hedge_rate: float | None
    backup_win_rate: float | None
    actor: str
    actor_named: bool

    @property
    def objective(self) -> Mapping[str, Any]:
        """``details.objective`` (rule 3's inputs and predictions), or empty."""
        return _mapping(self.details.get("objective"))

    @property
    def binding(self) -> str | None:
        """``details.binding``: the constraint that set the value, or None."""
        binding = self.details.get("binding")
        return binding if isinstance(binding, str) else None

    @property
    def quantile(self) -> str:
        """The objective's tail quantile's name (``P99`` unless configured otherwise)."""
        return _level(_number(self.objective.get("quantile")))

    @property
    def budget_text(self) -> str:
        """The budget for a sentence: ``10% budget`` or ``budget``."""
        return "budget" if self.budget is None else f"{_percent(self.budget)} budget"

    def objective_s(self, key: str) -> float | None:
        """A number of ``details.objective``."""
        return _number(self.objective.get(key))


def parse_row(row: Mapping[str, Any]) -> Row:
    reason = row.get("reason")
    codes = tuple(code.strip() for code in reason.split(",") if code.strip()) if isinstance(reason, str) else ()
    actor = row.get("actor")
    repeats = _count(row.get("repeats"))
    return Row(
        codes=codes,
        details=_mapping(row.get("details")),
        previous_s=_number(row.get("previous_hedge_after_s")),
        value_s=_number(row.get("hedge_after_s")),
        applied=row.get("applied") is True,
        repeats=repeats if repeats else 1,
        budget=_number(row.get("budget")),
        samples=_count(row.get("samples")),
        censored=_count(row.get("censored")),
        window_s=_number(row.get("window_s")),
        hedge_rate=_number(row.get("observed_hedge_rate")),
        backup_win_rate=_number(row.get("backup_win_rate")),
        actor=actor if isinstance(actor, str) and actor else "an operator",
        actor_named=isinstance(actor, str) and bool(actor),
    )
