"""The controller's budget policy: from one window's observation to the hedge_after_s to publish.

``decide(config, current, observation, knobs)`` is pure (no I/O, no clock). It applies, in order:

1. **Disabled / pinned.** A disabled route keeps its current value (or the default when nothing
   was published), source ``"disabled"``. A pinned route publishes the pinned value as is (no
   clamp), source ``"pinned"``.
2. **Too few samples.** No estimate, or fewer than ``knobs.min_samples`` primary samples: keep
   the current value (or the default), reason ``too_few_samples``; source ``"default"`` when
   nothing was ever published, else ``"controller"``.
3. **Censored raise.** ``target = estimate.target_s`` (the smallest observed t whose upper 95%
   bound on P(TTFT > t) is <= budget, see ``estimation``). ``None`` means the budget quantile lies
   beyond what the data shows (hedging censored it): raise by one bounded step,
   ``current * (1 + max_step_up)``, reason ``censored_raise``. With no censored sample at all a
   missing target only means the samples are too few for the budget's tail: hold
   (``too_few_samples``).
4. **Raise fast.** The short window (``short_window_calls >= SHORT_WINDOW_MIN_CALLS``) saw a hedge
   rate above the budget: a target above current is taken at once (``raise_over_budget``); a
   target below current is not followed (``over_budget_hold``). Without that signal a target
   above current is also taken at once (``target``): raising is always safe for the budget.
5. **Lower slowly.** A lower target is followed by at most ``current * (1 - max_step_down)`` per
   tick (adds ``step_down_limited`` when that bound bites).
6. **Hysteresis.** ``|new - current| / current < hysteresis``: hold (``hysteresis_hold``). Skipped
   when nothing was published yet (there is no value to keep stable).
7. **Clamp** to ``[min_hedge_after_s, max_hedge_after_s]`` (adds ``clamped_min`` /
   ``clamped_max``). Applies to every controller-sourced value, so a tightened bound also moves
   a held value.
8. **Flag.** ``hedges >= min_hedges_for_flag`` and ``backup_win_rate < min_backup_win_rate``
   adds ``backups_rarely_win`` (the backup probably shares the primary's queue), on every path.

``applied`` is True when the published value changes (always when nothing was published).

Worked number (defaults: budget 0.10, hysteresis 0.05, max_step_down 0.25, bounds 0.05-30 s):
current 2.0 s and a target of 0.9 s with a calm short window publish max(0.9, 2.0 * 0.75) =
1.5 s, reason ``target,step_down_limited``; next tick 1.125 s, then 0.9 s (``target``), then a
target of 0.93 s is a 3.3% change and is held (``hysteresis_hold``). If the short window then
shows 14% of 200 calls hedged and the target is 1.3 s, 1.3 s is published at once
(``raise_over_budget``).

Reason codes (``Decision.reason`` is comma-separated, main code first):

======================  =======================================================================
code                    meaning
======================  =======================================================================
disabled                route disabled; the current value (or default) is kept
pinned                  an operator pinned the value; published as is
too_few_samples         fewer than ``min_samples`` primary samples (or none), or too few for the
                        budget's tail with nothing censored: value kept
censored_raise          the budget quantile is censored: raised by ``1 + max_step_up``
raise_over_budget       short-window hedge rate above budget and target above current: raised
over_budget_hold        short-window hedge rate above budget but target below current: held
target                  moved to the KM target
hysteresis_hold         relative change under ``hysteresis``: held
step_down_limited       (modifier) a decrease was cut to ``max_step_down``
clamped_min/clamped_max (modifier) the value was clamped to the route's bounds
backups_rarely_win      (flag) enough hedges, and backups win less than ``min_backup_win_rate``
======================  =======================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hedgerow.controller.estimation import TTFTEstimate

__all__ = [
    "RouteConfig",
    "PolicyKnobs",
    "Observation",
    "Decision",
    "decide",
    "SHORT_WINDOW_MIN_CALLS",
    "REASON_CODES",
]

#: Fewest calls in the short window before its hedge rate is trusted (at 20 calls and a 10%
#: budget, a rate above budget means at least 3 hedges, not one unlucky call).
SHORT_WINDOW_MIN_CALLS = 20

#: Every code ``decide`` can put in ``Decision.reason``.
REASON_CODES = frozenset(
    {
        "disabled",
        "pinned",
        "too_few_samples",
        "censored_raise",
        "raise_over_budget",
        "over_budget_hold",
        "target",
        "hysteresis_hold",
        "step_down_limited",
        "clamped_min",
        "clamped_max",
        "backups_rarely_win",
    }
)


def _is_number(value: Any) -> bool:
    """True for a real int/float (bool excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_positive(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a finite number > 0."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_fraction(name: str, value: Any, *, low_open: bool, high_open: bool) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is in the given interval of [0, 1]."""
    ok = _is_number(value) and math.isfinite(value)
    if ok:
        ok = (value > 0 if low_open else value >= 0) and (value < 1 if high_open else value <= 1)
    if not ok:
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def _check_count(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """One (route, model)'s configuration as stored in the ``routes`` table.

    Attributes:
        enabled: hedging on for this route; a disabled route's value is never changed.
        budget: largest allowed fraction of calls that hedge, in (0, 1).
        default_hedge_after_s: value published before there are enough samples, seconds.
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
        _check_fraction("budget", self.budget, low_open=True, high_open=True)
        _check_positive("default_hedge_after_s", self.default_hedge_after_s)
        _check_positive("min_hedge_after_s", self.min_hedge_after_s)
        _check_positive("max_hedge_after_s", self.max_hedge_after_s)
        if self.min_hedge_after_s > self.max_hedge_after_s:
            raise ValueError(
                f"min_hedge_after_s ({self.min_hedge_after_s}) exceeds max_hedge_after_s"
                f" ({self.max_hedge_after_s})"
            )
        if self.pinned_hedge_after_s is not None:
            _check_positive("pinned_hedge_after_s", self.pinned_hedge_after_s)


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """Controller-wide tuning of ``decide`` (from ``hedgerow.settings.Settings``).

    Attributes:
        min_samples: fewest primary TTFT samples (censored included) for a decision.
        hysteresis: relative change below which the published value is held, in [0, 1).
        max_step_down: largest relative decrease per tick, in [0, 1) (0.25: to 75% at most).
        max_step_up: relative increase per tick when the budget quantile is censored, > 0.
        min_backup_win_rate: below this backup win rate the route is flagged, in [0, 1].
        min_hedges_for_flag: fewest hedges in the window before the flag can fire.

    Raises:
        ValueError: a field out of range (named in the message).
    """

    min_samples: int = 50
    hysteresis: float = 0.05
    max_step_down: float = 0.25
    max_step_up: float = 1.0
    min_backup_win_rate: float = 0.2
    min_hedges_for_flag: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.min_samples, int) or isinstance(self.min_samples, bool) or (
            self.min_samples < 1
        ):
            raise ValueError(f"min_samples must be an integer >= 1, got {self.min_samples!r}")
        _check_fraction("hysteresis", self.hysteresis, low_open=False, high_open=True)
        _check_fraction("max_step_down", self.max_step_down, low_open=False, high_open=True)
        _check_positive("max_step_up", self.max_step_up)
        _check_fraction(
            "min_backup_win_rate", self.min_backup_win_rate, low_open=False, high_open=False
        )
        _check_count("min_hedges_for_flag", self.min_hedges_for_flag)

    @classmethod
    def from_settings(cls, settings: Any) -> PolicyKnobs:
        """Build the knobs from a ``hedgerow.settings.Settings``.

        Args:
            settings: the settings object; its ``min_samples``, ``hysteresis``,
                ``max_step_down``, ``max_step_up`` and ``min_backup_win_rate`` are read;
                ``min_hedges_for_flag`` keeps its default (it has no setting).

        Returns:
            The knobs.

        Raises:
            ValueError: a setting out of range (named in the message).
        """
        return cls(
            min_samples=settings.min_samples,
            hysteresis=settings.hysteresis,
            max_step_down=settings.max_step_down,
            max_step_up=settings.max_step_up,
            min_backup_win_rate=settings.min_backup_win_rate,
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """What one controller tick saw for one (route, model).

    Attributes:
        estimate: KM estimate of the primary's TTFT over the window, computed with the route's
            budget; ``None`` when there were no samples at all.
        window_s: the window actually used (after widening), seconds.
        calls: calls in the window.
        observed_hedge_rate: hedged (``ttft_timeout``) calls / calls in the window, or ``None``.
        backup_win_rate: hedged calls won by the backup / hedged calls, or ``None``.
        hedges: hedged (``ttft_timeout``) calls in the window.
        short_window_calls: calls in the short (5 min) window.
        short_window_hedge_rate: hedged calls / calls in the short window, or ``None``.

    Raises:
        ValueError: a field out of range (named in the message).
    """

    estimate: TTFTEstimate | None
    window_s: float
    calls: int
    observed_hedge_rate: float | None
    backup_win_rate: float | None
    hedges: int
    short_window_calls: int
    short_window_hedge_rate: float | None

    def __post_init__(self) -> None:
        if self.estimate is not None and not isinstance(self.estimate, TTFTEstimate):
            raise ValueError(f"estimate must be a TTFTEstimate or None, got {self.estimate!r}")
        _check_positive("window_s", self.window_s)
        _check_count("calls", self.calls)
        _check_count("hedges", self.hedges)
        _check_count("short_window_calls", self.short_window_calls)
        for name in ("observed_hedge_rate", "backup_win_rate", "short_window_hedge_rate"):
            value = getattr(self, name)
            if value is not None:
                _check_fraction(name, value, low_open=False, high_open=False)


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one ``decide`` call.

    Attributes:
        hedge_after_s: the value to publish, seconds.
        applied: True when it differs from the current published value (or nothing was
            published yet).
        reason: comma-separated codes from ``REASON_CODES``, main one first.
        source: ``"pinned"``, ``"disabled"``, ``"default"`` or ``"controller"``.
    """

    hedge_after_s: float
    applied: bool
    reason: str
    source: str


def _flag_codes(observation: Observation, knobs: PolicyKnobs) -> list[str]:
    """Rule 8: the flags the observation raises (currently only ``backups_rarely_win``)."""
    if (
        observation.hedges >= knobs.min_hedges_for_flag
        and observation.backup_win_rate is not None
        and observation.backup_win_rate < knobs.min_backup_win_rate
    ):
        return ["backups_rarely_win"]
    return []


def _finish(
    value: float,
    current: float | None,
    codes: list[str],
    source: str,
    observation: Observation,
    knobs: PolicyKnobs,
) -> Decision:
    """Add the flags and build the ``Decision`` (``applied`` from comparing with current)."""
    codes = codes + _flag_codes(observation, knobs)
    return Decision(
        hedge_after_s=float(value),
        applied=current is None or value != current,
        reason=",".join(codes),
        source=source,
    )


def decide(
    config: RouteConfig,
    current_hedge_after_s: float | None,
    observation: Observation,
    knobs: PolicyKnobs,
) -> Decision:
    """Decide the ``hedge_after_s`` to publish for one (route, model) this tick.

    Args:
        config: the route's configuration.
        current_hedge_after_s: the value published now, seconds; ``None`` when nothing was
            published yet (the default is the starting point).
        observation: what the tick measured; ``observation.estimate`` must have been computed
            with ``budget=config.budget``.
        knobs: the policy knobs.

    Returns:
        The ``Decision`` (value, applied, reason codes, source); see the module docstring for
        the rules and codes.

    Raises:
        ValueError: ``current_hedge_after_s`` not a finite number > 0, or the estimate's budget
            differs from ``config.budget`` (the message names the argument).
    """
    if not isinstance(config, RouteConfig):
        raise ValueError(f"config must be a RouteConfig, got {type(config).__name__}")
    if not isinstance(observation, Observation):
        raise ValueError(f"observation must be an Observation, got {type(observation).__name__}")
    if not isinstance(knobs, PolicyKnobs):
        raise ValueError(f"knobs must be a PolicyKnobs, got {type(knobs).__name__}")
    if current_hedge_after_s is not None:
        _check_positive("current_hedge_after_s", current_hedge_after_s)
    current = current_hedge_after_s
    base = config.default_hedge_after_s if current is None else float(current)

    # 1. disabled / pinned: no controller logic.
    if not config.enabled:
        return _finish(base, current, ["disabled"], "disabled", observation, knobs)
    if config.pinned_hedge_after_s is not None:
        pinned = config.pinned_hedge_after_s
        return _finish(pinned, current, ["pinned"], "pinned", observation, knobs)

    estimate = observation.estimate
    source = "controller"
    # 2. too few samples: keep what we have.
    if estimate is None or estimate.samples < knobs.min_samples:
        proposed, codes = base, ["too_few_samples"]
        if current is None:
            source = "default"
    else:
        if estimate.budget is None or not math.isclose(estimate.budget, config.budget):
            raise ValueError(
                f"observation.estimate.budget ({estimate.budget!r}) must equal config.budget"
                f" ({config.budget!r}): the target is only meaningful for the route's budget"
            )
        target = estimate.target_s
        short_over = (
            observation.short_window_hedge_rate is not None
            and observation.short_window_calls >= SHORT_WINDOW_MIN_CALLS
            and observation.short_window_hedge_rate > config.budget
        )
        if target is None and estimate.censored == 0:
            # 3. nothing censored, yet no time is confidently under the budget: the samples are
            #    too few for this budget's tail. Raising would only follow noise; keep the value.
            proposed, codes = base, ["too_few_samples"]
        elif target is None:
            # 3. the budget quantile is censored: raise by a bounded step.
            proposed, codes = base * (1.0 + knobs.max_step_up), ["censored_raise"]
        elif target > base:
            # 4. raise fast.
            proposed, codes = target, ["raise_over_budget" if short_over else "target"]
        elif target < base and short_over:
            # 4. over budget but the estimate says lower: do not lower now.
            proposed, codes = base, ["over_budget_hold"]
        else:
            # 5. lower slowly.
            floor = base * (1.0 - knobs.max_step_down)
            if target < floor:
                proposed, codes = floor, ["target", "step_down_limited"]
            else:
                proposed, codes = target, ["target"]
        # 6. hysteresis (only against a published value).
        if current is not None and proposed != base:
            if abs(proposed - base) / base < knobs.hysteresis:
                proposed, codes = base, ["hysteresis_hold"]

    # 7. clamp.
    if proposed < config.min_hedge_after_s:
        proposed, codes = config.min_hedge_after_s, codes + ["clamped_min"]
    elif proposed > config.max_hedge_after_s:
        proposed, codes = config.max_hedge_after_s, codes + ["clamped_max"]
    return _finish(proposed, current, codes, source, observation, knobs)
