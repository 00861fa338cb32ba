"""The controller's budget policy: from one window's observation to the hedge_after_s to publish.

``decide(config, current, observation, knobs)`` is pure (no I/O, no clock). It applies, in order:

1. **Disabled / pinned.** A disabled route keeps its current value (or the default when nothing
   was published), source ``"disabled"``. A pinned route publishes the pinned value as is (no
   clamp), source ``"pinned"``.
2. **Too few samples.** No estimate, or fewer than ``knobs.min_samples`` primary samples even
   after the job widened the window (``jobs``: 1 h doubling up to ``max_window_s`` = 24 h): keep
   the current value (or the default), reason ``too_few_samples``; source ``"default"`` when
   nothing was ever published, else ``"controller"``.
3. **Target / censored raise.** ``target = estimate.target_s = min{t_i observed first-token
   time : U(t_i) <= budget}``, ``U`` the upper bound of the pointwise 95% confidence interval on
   ``S(t) = P(TTFT > t)`` (see ``estimation``); a primary threshold there hedges at most
   ``budget`` of the calls with ~97.5% one-sided confidence. ``None`` means the budget quantile lies
   beyond what the data shows: then

   - **too few samples, not censoring** (``estimate.too_few_for_budget``): nothing is censored,
     or even counting every censored sample as a first token at its censoring time gives no
     time whose bound is under the budget with at least ``n * budget / 2`` samples at risk
     (``TTFTEstimate.target_all_events_s`` is None): hold, ``too_few_samples`` (the job widens
     the window first, as in rule 2). The ops review's repro: 120 calls, 3 primaries censored,
     budget 0.05: the all-events bound only gets under 0.05 at the 119th of 120 sorted samples
     (2 at risk, fewer than 120 * 0.05 / 2 = 3): hold. Before this check the route raised
     2.0 -> 4.0 -> 8.0 -> 16.0 -> 30 s on the same data;
   - **censoring hides the target** and ``current <= estimate.max_censored_s`` (the current
     value lies at or below the censored region, so the censoring is what the current value
     causes): raise by one bounded step, ``current * (1 + max_step_up)``, reason
     ``censored_raise``; the result is at most ``(1 + max_step_up) * max_censored_s``;
   - otherwise (current above every censoring time) hold, ``censored_hold``: the window's
     data cannot inform a value above its own censoring times, so repeated raises on unchanged
     data stop after one step. Worked number: hedging at 0.8 s with backups cancelling the
     primaries at up to 0.85 s (1,000 calls, budget 0.10): 0.8 s -> 1.6 s (``censored_raise``);
     the next tick on the same data holds 1.6 s (1.6 > 0.85, ``censored_hold``); calls hedged
     at 1.6 s then censor at > 1.6 s and allow the next raise if still needed.
3b. **Efficiency.** The budget target is a floor, not an aim: a lower threshold is only worth
   its hedges if they cut the tail. When the observation carries the window's samples (primary,
   with their start times, and the hedges' backups), ``hedge_model.efficient_threshold``
   predicts the call-level P99 for thresholds from the budget target up to the primary's KM P99
   (capped by ``max_hedge_after_s``), with ``P(T > x) = S(x) * G(x - t)`` past the threshold and
   the client's hedge bucket replayed over the window (``knobs.client_budget_burst``), and takes
   the **largest** threshold whose predicted P99 is within ``knobs.p99_tolerance`` (2%) of the
   smallest: the fewest hedges for nearly the same tail. When that is above the budget target it
   replaces it as the target of rules 4-5 (main code ``efficient_raise`` instead of ``target``).
   When the bucket replay predicts a *worse* P99 at the budget target than the best by more
   than the tolerance (``bucket_limited``), the smallest best threshold is taken instead (the
   replay overrates high thresholds after a slowdown; see ``hedge_model``). **Rarely-win
   raise**: when the window's observed backup win rate is under ``knobs.min_backup_win_rate``
   with at least ``knobs.min_hedges_for_flag`` hedges (the ``backups_rarely_win`` flag's
   condition), the efficient target is the top of the search, the primary's KM P99:
   ``max(efficient, min(max_hedge_after_s, max(budget_target, P99)))``. Those hedges mostly
   lose, so they buy little tail and add load to the other upstreams (which the model does not
   see); a threshold at the P99 still hedges the slowest 1% as a guard against drift, and
   since the observed win rate is measured at the current threshold, the rule stops once the
   hedges at the higher threshold win often enough. Its inputs (both targets, the predicted P99
   and backup win probability at each, the hedge rate each would give, ``bucket_limited``,
   ``rarely_win_raise``) go to ``Decision.details["efficiency"]``. Without samples the rule is
   skipped; with fewer than ``knobs.min_backup_samples`` backup samples the primary's curve
   stands in for the backup's. In ``bench/controller_eval.py`` (budget 0.10, seeds 0-2) the two
   rules took the adaptive way from P99 1.603 s at 4.99% hedged to 1.573 s at 3.70% (seeds
   10-12: 1.520 s / 4.51% to 1.516 s / 3.97%; budget 0.05: 5.854 s / 2.21% to 5.082 s / 1.96%).
4. **Raise fast.** The short window (last ``short_window_s`` = 5 min by default, with
   ``short_window_calls >= knobs.short_window_min_calls``, default 20) saw a hedge rate above the
   budget (with ``knobs.short_window_counts_denied``, the *wanted* rate: hedges sent plus hedges
   the client's bucket denied, since a bucket that runs dry hides a threshold that asks for too
   much; off by default: in ``bench/controller_eval.py`` it fired during the slowdown, raised the
   threshold when early hedges mattered most and cost 4-6% of P99 in each of three scenarios,
   while the buckets held the 5-minute hedge rates anyway): a target above current is taken at
   once (``raise_over_budget``); a
   target below current is not followed (``over_budget_hold``). The short window's own KM target
   (``short_window_target_s``, from its samples alone) is taken too when it is higher, so that a
   sudden slowdown is followed within one tick rather than as the 1 h window fills with slow
   samples; it is conservative (few samples give a wide bound, so a high target, or none).
   Without that signal a target above current is also taken at once (``target``): raising is
   always safe for the budget.
5. **Lower slowly.** A lower target is followed by at most ``current * (1 - max_step_down)`` per
   tick, i.e. ``new = max(target, current * (1 - max_step_down))`` (adds ``step_down_limited``
   when that bound bites); from 2.0 s at the default 0.25, k ticks reach at least
   ``2.0 * 0.75^k`` s.
6. **Hysteresis.** ``|new - current| / current < hysteresis``: hold (``hysteresis_hold``). Skipped
   when nothing was published yet (there is no value to keep stable).
7. **Clamp** to ``[min_hedge_after_s, max_hedge_after_s]`` (adds ``clamped_min`` /
   ``clamped_max``). Applies to every controller-sourced value, so a tightened bound also moves
   a held value.
8. **Flag** (on every path, once ``hedges >= min_hedges_for_flag``):

   - ``backup_win_rate < min_backup_win_rate`` adds ``backups_rarely_win`` (the backup probably
     shares the primary's queue);
   - ``hedges_did_not_lower_p99``: the P99 *with* hedging is the call-level P99 TTFT the app saw
     (``observation.call_p99_s``); the P99 *without* hedging is the primary's KM P99
     (``estimate.p99_s``, censoring handled, so it is what the primary alone would have given).
     With ``m = min_p99_improvement`` (default 0.05) the flag fires when
     ``call_p99_s >= (1 - m) * primary_p99_s``. When the primary's P99 is not identified (the
     slow primaries were cancelled, which is what working hedges do) its lower bound
     ``max_observed_s`` is used: ``call_p99_s < (1 - m) * bound`` proves the hedges lowered the
     P99 (no flag); anything else is undecided (no flag, no ``p99_check``). The inputs go to
     ``Decision.details["p99_check"]`` and from there to the history row's ``details``.

``applied`` is True when the published value changes (always when nothing was published).

Worked number (defaults: budget 0.10, hysteresis 0.05, max_step_down 0.25, bounds 0.05-30 s):
current 2.0 s and a target of 0.9 s with a calm short window publish max(0.9, 2.0 * 0.75) =
1.5 s, reason ``target,step_down_limited``; next tick 1.125 s, then 0.9 s (``target``), then a
target of 0.93 s is a 3.3% change and is held (``hysteresis_hold``). If the short window then
shows 14% of 200 calls hedged and the target is 1.3 s, 1.3 s is published at once
(``raise_over_budget``). P99 check: with 40 hedges, a primary KM P99 of 4.0 s and a call-level
P99 of 3.9 s, the limit is 0.95 * 4.0 = 3.8 s and 3.9 >= 3.8, so ``hedges_did_not_lower_p99`` is
added; a call-level P99 of 2.5 s is a 37.5% improvement and is not flagged.

Reason codes (``Decision.reason`` is comma-separated, main code first):

========================  =======================================================================
code                      meaning
========================  =======================================================================
disabled                  route disabled; the current value (or default) is kept
pinned                    an operator pinned the value; published as is
too_few_samples           fewer than ``min_samples`` primary samples (or none), or too few for the
                          budget's tail with nothing censored: value kept
too_few_samples           (also) no target, and counting the censored samples as first tokens
                          would not give one either (``TTFTEstimate.too_few_for_budget``)
censored_raise            the budget quantile is censored and the current value is at or below
                          the largest censoring time: raised by ``1 + max_step_up``
censored_hold             the budget quantile is censored but the current value is already above
                          every censoring time: held until calls at that value arrive
raise_over_budget         short-window hedge rate above budget and target above current: raised
over_budget_hold          short-window hedge rate above budget but target below current: held
target                    moved to the KM target
efficient_raise           moved to the efficient target (rule 3b), above the KM target
hysteresis_hold           relative change under ``hysteresis``: held
step_down_limited         (modifier) a decrease was cut to ``max_step_down``
clamped_min/clamped_max   (modifier) the value was clamped to the route's bounds
backups_rarely_win        (flag) enough hedges, and backups win less than ``min_backup_win_rate``
hedges_did_not_lower_p99  (flag) enough hedges, and the call-level P99 is not
                          ``min_p99_improvement`` below the primary's KM P99
config                    (first code; set by ``routes_admin``, not by ``decide``) an operator
                          changed the route's configuration; the decision's codes follow
========================  =======================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hedgerow.controller.estimation import TTFTEstimate
from hedgerow.controller.hedge_model import (
    BucketReplay,
    efficient_threshold,
    km_survival,
    predicted_quantiles,
    win_probability,
)

__all__ = [
    "REASON_CODES",
    "SHORT_WINDOW_MIN_CALLS",
    "Decision",
    "Observation",
    "PolicyKnobs",
    "RouteConfig",
    "decide",
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
        "censored_hold",
        "raise_over_budget",
        "over_budget_hold",
        "target",
        "efficient_raise",
        "hysteresis_hold",
        "step_down_limited",
        "clamped_min",
        "clamped_max",
        "backups_rarely_win",
        "hedges_did_not_lower_p99",
        "config",
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
                f"min_hedge_after_s ({self.min_hedge_after_s}) exceeds max_hedge_after_s ({self.max_hedge_after_s})"
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
        min_hedges_for_flag: fewest hedges in the window before a flag can fire.
        short_window_min_calls: fewest calls in the short window before its hedge rate is
            trusted (rule 4), >= 1.
        min_p99_improvement: fraction by which the call-level P99 TTFT must undercut the
            primary's KM P99, else ``hedges_did_not_lower_p99``, in [0, 1).
        p99_tolerance: rule 3b: relative slack on the predicted call P99 within which a higher
            (cheaper) threshold than the budget target is preferred, >= 0 (0: only exact ties).
        min_backup_samples: fewest backup TTFT samples for the backup's own survival curve in
            rule 3b; with fewer, the primary's curve stands in for it, >= 1.
        client_budget_burst: capacity (tokens) of the clients' hedge bucket assumed by rule 3b's
            replay, >= 0; 0 leaves the bucket's denials out of the prediction.
        short_window_counts_denied: rule 4 tests the short window's *wanted* hedge rate (hedged
            + denied by the bucket) against the budget, not only the hedges sent (default off:
            see the module docstring).

    Raises:
        ValueError: a field out of range (named in the message).
        TypeError: ``short_window_counts_denied`` is not a bool.
    """

    min_samples: int = 50
    hysteresis: float = 0.05
    max_step_down: float = 0.25
    max_step_up: float = 1.0
    min_backup_win_rate: float = 0.2
    min_hedges_for_flag: int = 20
    short_window_min_calls: int = SHORT_WINDOW_MIN_CALLS
    min_p99_improvement: float = 0.05
    p99_tolerance: float = 0.02
    min_backup_samples: int = 20
    client_budget_burst: float = 10.0
    short_window_counts_denied: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.min_samples, int) or isinstance(self.min_samples, bool) or (self.min_samples < 1):
            raise ValueError(f"min_samples must be an integer >= 1, got {self.min_samples!r}")
        _check_fraction("hysteresis", self.hysteresis, low_open=False, high_open=True)
        _check_fraction("max_step_down", self.max_step_down, low_open=False, high_open=True)
        _check_positive("max_step_up", self.max_step_up)
        _check_fraction("min_backup_win_rate", self.min_backup_win_rate, low_open=False, high_open=False)
        _check_count("min_hedges_for_flag", self.min_hedges_for_flag)
        _check_count("short_window_min_calls", self.short_window_min_calls)
        if self.short_window_min_calls < 1:
            raise ValueError(f"short_window_min_calls must be an integer >= 1, got {self.short_window_min_calls!r}")
        _check_fraction("min_p99_improvement", self.min_p99_improvement, low_open=False, high_open=True)
        if not _is_number(self.p99_tolerance) or not (math.isfinite(self.p99_tolerance) and self.p99_tolerance >= 0):
            raise ValueError(f"p99_tolerance must be a finite number >= 0, got {self.p99_tolerance!r}")
        _check_count("min_backup_samples", self.min_backup_samples)
        if not isinstance(self.short_window_counts_denied, bool):
            raise TypeError(f"short_window_counts_denied must be a bool, got {self.short_window_counts_denied!r}")
        if not _is_number(self.client_budget_burst) or not (
            math.isfinite(self.client_budget_burst) and self.client_budget_burst >= 0
        ):
            raise ValueError(f"client_budget_burst must be a finite number >= 0, got {self.client_budget_burst!r}")
        if self.min_backup_samples < 1:
            raise ValueError(f"min_backup_samples must be an integer >= 1, got {self.min_backup_samples!r}")

    @classmethod
    def from_settings(cls, settings: Any) -> PolicyKnobs:
        """Build the knobs from a ``hedgerow.settings.Settings``.

        Args:
            settings: the settings object; its ``min_samples``, ``hysteresis``,
                ``max_step_down``, ``max_step_up``, ``min_backup_win_rate``,
                ``min_hedges_for_flag``, ``short_window_min_calls``, ``min_p99_improvement``,
                ``p99_tolerance``, ``min_backup_samples``, ``client_budget_burst`` and
                ``short_window_counts_denied`` are read.

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
            min_hedges_for_flag=settings.min_hedges_for_flag,
            short_window_min_calls=settings.short_window_min_calls,
            min_p99_improvement=settings.min_p99_improvement,
            p99_tolerance=settings.p99_tolerance,
            min_backup_samples=settings.min_backup_samples,
            client_budget_burst=settings.client_budget_burst,
            short_window_counts_denied=settings.short_window_counts_denied,
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
        call_ttft_samples: calls in the window with a call-level TTFT (the first token the app
            saw, hedged or not; failovers and failed calls excluded).
        call_p99_s: P99 of those call-level TTFTs, seconds (smallest observed t with empirical
            CDF >= 0.99), or ``None`` without samples. Compared with ``estimate.p99_s`` (the
            primary's KM P99, i.e. the P99 without hedging) by the ``hedges_did_not_lower_p99``
            flag.
        short_window_target_s: the KM target (same budget and confidence) over the primary
            samples of the short window alone, seconds, or ``None`` (too few samples for a
            confident bound, or the budget quantile censored). Used by rule 4 only.
        wanted_hedge_rate: calls whose threshold passed (hedged, or ``hedge_denied`` by the
            client's budget bucket) / calls in the window, or ``None``.
        short_window_wanted_rate: the same in the short window, or ``None``. Rule 4 tests the
            larger of it and ``short_window_hedge_rate`` against the budget: a hedge the bucket
            denied was still wanted by the threshold.
        primary_durations_s / primary_censored: the primary TTFT samples behind ``estimate``
            (seconds; True = censored), shape (n,) each; empty when not supplied (rule 3b is
            then skipped).
        primary_started_s: when each primary sample's call started, seconds on any common
            clock, shape (n,) or empty; with it, rule 3b replays the client's hedge bucket over
            the calls in that order (hedges it would deny are part of the prediction).
        backup_durations_s / backup_censored: the hedges' backup TTFT samples of the same window,
            measured from the backup's own send: its TTFT when it had a first token, else the
            time it was cancelled at (censored); failed backups are not samples. Shape (m,).

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
    call_ttft_samples: int = 0
    call_p99_s: float | None = None
    short_window_target_s: float | None = None
    wanted_hedge_rate: float | None = None
    short_window_wanted_rate: float | None = None
    primary_durations_s: tuple[float, ...] = ()
    primary_censored: tuple[bool, ...] = ()
    primary_started_s: tuple[float, ...] = ()
    backup_durations_s: tuple[float, ...] = ()
    backup_censored: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.estimate is not None and not isinstance(self.estimate, TTFTEstimate):
            raise ValueError(f"estimate must be a TTFTEstimate or None, got {self.estimate!r}")
        _check_positive("window_s", self.window_s)
        _check_count("calls", self.calls)
        _check_count("hedges", self.hedges)
        _check_count("short_window_calls", self.short_window_calls)
        _check_count("call_ttft_samples", self.call_ttft_samples)
        if self.short_window_target_s is not None:
            _check_positive("short_window_target_s", self.short_window_target_s)
        if self.call_p99_s is not None and (
            not _is_number(self.call_p99_s) or not math.isfinite(self.call_p99_s) or self.call_p99_s < 0
        ):
            raise ValueError(f"call_p99_s must be a finite number >= 0 or None, got {self.call_p99_s!r}")
        for name in (
            "observed_hedge_rate",
            "backup_win_rate",
            "short_window_hedge_rate",
            "wanted_hedge_rate",
            "short_window_wanted_rate",
        ):
            value = getattr(self, name)
            if value is not None:
                _check_fraction(name, value, low_open=False, high_open=False)
        for kind in ("primary", "backup"):
            durations = getattr(self, f"{kind}_durations_s")
            flags = getattr(self, f"{kind}_censored")
            if len(durations) != len(flags):
                raise ValueError(
                    f"{kind}_durations_s and {kind}_censored differ in length ({len(durations)} != {len(flags)})"
                )
            if kind == "primary" and self.primary_started_s and (len(self.primary_started_s) != len(durations)):
                raise ValueError(
                    "primary_started_s must be empty or as long as primary_durations_s"
                    f" ({len(self.primary_started_s)} != {len(durations)})"
                )
            if durations:
                values = np.asarray(durations, dtype=float)
                if not np.all(np.isfinite(values)) or values.min() < 0:
                    raise ValueError(f"{kind}_durations_s must be finite and >= 0 seconds")


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one ``decide`` call.

    Attributes:
        hedge_after_s: the value to publish, seconds.
        applied: True when it differs from the current published value (or nothing was
            published yet).
        reason: comma-separated codes from ``REASON_CODES``, main one first.
        source: ``"pinned"``, ``"disabled"``, ``"default"`` or ``"controller"``.
        details: machine-readable inputs of the flags, e.g. ``{"p99_check": {"call_p99_s",
            "primary_p99_s", "primary_p99_is_lower_bound", "min_p99_improvement", "limit_s",
            "call_ttft_samples", "hedges", "flagged"}}``; empty when no flag check had enough
            data or its answer was undecided.
    """

    hedge_after_s: float
    applied: bool
    reason: str
    source: str
    details: dict[str, Any] = field(default_factory=dict)


def _flags(observation: Observation, knobs: PolicyKnobs) -> tuple[list[str], dict[str, Any]]:
    """Rule 8: the flags the observation raises, and the inputs of the P99 check.

    Returns:
        ``(codes, details)``: codes among ``backups_rarely_win`` and ``hedges_did_not_lower_p99``;
        ``details`` holds ``p99_check`` when that check had its inputs (enough hedges, a
        call-level P99 and an identified primary KM P99), else it is empty.
    """
    codes: list[str] = []
    details: dict[str, Any] = {}
    enough_hedges = observation.hedges >= knobs.min_hedges_for_flag
    if (
        enough_hedges
        and observation.backup_win_rate is not None
        and observation.backup_win_rate < knobs.min_backup_win_rate
    ):
        codes.append("backups_rarely_win")
    estimate = observation.estimate
    if not enough_hedges or observation.call_p99_s is None or estimate is None:
        return codes, details
    # The primary's P99 is often censored exactly when hedges work (the slow primaries were
    # cancelled); its lower bound then still proves an improvement, never its absence.
    identified = estimate.p99_s is not None
    primary_p99_s = estimate.p99_s if estimate.p99_s is not None else estimate.max_observed_s
    limit_s = (1.0 - knobs.min_p99_improvement) * primary_p99_s
    flagged = observation.call_p99_s >= limit_s
    if flagged and not identified:
        return codes, details  # call P99 above a fraction of a lower bound: undecided
    if flagged:
        codes.append("hedges_did_not_lower_p99")
    details["p99_check"] = {
        "call_p99_s": observation.call_p99_s,
        "primary_p99_s": primary_p99_s,
        "primary_p99_is_lower_bound": not identified,
        "min_p99_improvement": knobs.min_p99_improvement,
        "limit_s": limit_s,
        "call_ttft_samples": observation.call_ttft_samples,
        "hedges": observation.hedges,
        "flagged": flagged,
    }
    return codes, details


def _finite_or_none(value: float | None) -> float | None:
    """JSON-safe: ``inf``/NaN become None."""
    return None if value is None or not math.isfinite(value) else float(value)


def _efficient_target(
    config: RouteConfig,
    current: float,
    estimate: TTFTEstimate,
    budget_target_s: float,
    observation: Observation,
    knobs: PolicyKnobs,
) -> tuple[float, dict[str, Any]] | None:
    """Rule 3b: the largest threshold >= the budget target whose predicted P99 is near the best.

    Returns:
        ``(efficient_target_s, details)``, or None when the observation carries no primary
        samples. The search runs from the budget target up to the primary's KM P99 (its lower
        bound ``max_observed_s`` when not identified), capped by ``max_hedge_after_s``: a
        threshold past the P99 without hedging cannot lower the P99, and keeping the threshold
        at or below it keeps the hedges as a guard against a sudden slowdown. When the
        window's backups rarely win (at least ``knobs.min_hedges_for_flag`` hedges and a backup
        win rate under ``knobs.min_backup_win_rate``), the top of that search is returned
        (``details["rarely_win_raise"]``; see the module docstring, rule 3b).
    """
    if not observation.primary_durations_s:
        return None
    primary = km_survival(observation.primary_durations_s, observation.primary_censored)
    n_backup = len(observation.backup_durations_s)
    backup = None
    if n_backup >= knobs.min_backup_samples and not all(observation.backup_censored):
        backup = km_survival(observation.backup_durations_s, observation.backup_censored)
    no_hedge_p99_s = estimate.p99_s if estimate.p99_s is not None else estimate.max_observed_s
    top_s = min(config.max_hedge_after_s, max(budget_target_s, no_hedge_p99_s))
    replay = None
    if knobs.client_budget_burst > 0 and observation.primary_started_s:
        order = np.argsort(np.asarray(observation.primary_started_s, dtype=float), kind="stable")
        replay = BucketReplay(
            durations_s=np.asarray(observation.primary_durations_s, dtype=float)[order],
            censored=np.asarray(observation.primary_censored, dtype=bool)[order],
            budget=config.budget,
            burst=knobs.client_budget_burst,
        )
    choice = efficient_threshold(primary, backup, budget_target_s, top_s, tolerance=knobs.p99_tolerance, replay=replay)
    g = backup if backup is not None else primary
    efficient_s = choice.hedge_after_s
    rarely_win = (
        observation.hedges >= knobs.min_hedges_for_flag
        and observation.backup_win_rate is not None
        and observation.backup_win_rate < knobs.min_backup_win_rate
    )
    p99_at_efficient_s = choice.p99_at_choice_s
    win_at_efficient = choice.win_probability_at_choice
    if rarely_win and top_s > efficient_s:
        efficient_s = top_s
        p99_at_efficient_s = float(predicted_quantiles(primary, g, np.array([top_s]), 0.99, replay)[0])
        win_at_efficient = win_probability(primary, g, top_s)
    details = {
        "budget_target_s": choice.budget_target_s,
        "efficient_target_s": efficient_s,
        "model_target_s": choice.hedge_after_s,
        "bucket_limited": choice.bucket_limited,
        "rarely_win_raise": rarely_win,
        "search_top_s": top_s,
        "predicted_p99_at_budget_target_s": _finite_or_none(choice.p99_at_budget_s),
        "predicted_p99_at_efficient_target_s": _finite_or_none(p99_at_efficient_s),
        "predicted_min_p99_s": _finite_or_none(choice.min_p99_s),
        "win_probability_at_budget_target": choice.win_probability_at_budget,
        "win_probability_at_efficient_target": win_at_efficient,
        "win_probability_at_current": win_probability(primary, g, current),
        "hedge_rate_at_budget_target": float(primary(choice.budget_target_s)),
        "hedge_rate_at_efficient_target": float(primary(efficient_s)),
        "p99_tolerance": knobs.p99_tolerance,
        "backup_samples": n_backup,
        "backup_curve": choice.backup_source,
        "bucket_replay": replay is not None,
    }
    return efficient_s, details


def _finish(
    value: float,
    current: float | None,
    codes: list[str],
    source: str,
    observation: Observation,
    knobs: PolicyKnobs,
    extra: dict[str, Any] | None = None,
) -> Decision:
    """Add the flags and build the ``Decision`` (``applied`` from comparing with current)."""
    flag_codes, details = _flags(observation, knobs)
    details = (extra or {}) | details
    return Decision(
        hedge_after_s=float(value),
        applied=current is None or value != current,
        reason=",".join(codes + flag_codes),
        source=source,
        details=details,
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
        TypeError: ``config``, ``observation`` or ``knobs`` of the wrong type (named).
        ValueError: ``current_hedge_after_s`` not a finite number > 0, or the estimate's budget
            differs from ``config.budget`` (the message names the argument).
    """
    if not isinstance(config, RouteConfig):
        raise TypeError(f"config must be a RouteConfig, got {type(config).__name__}")
    if not isinstance(observation, Observation):
        raise TypeError(f"observation must be an Observation, got {type(observation).__name__}")
    if not isinstance(knobs, PolicyKnobs):
        raise TypeError(f"knobs must be a PolicyKnobs, got {type(knobs).__name__}")
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
    extra: dict[str, Any] = {}
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
        # Rule 4's signal: the hedges sent in the short window, and with
        # knobs.short_window_counts_denied also those the client's bucket denied (wanted).
        short_rates = [
            r
            for r in (
                observation.short_window_hedge_rate,
                observation.short_window_wanted_rate if knobs.short_window_counts_denied else None,
            )
            if r is not None
        ]
        short_over = (
            bool(short_rates)
            and observation.short_window_calls >= knobs.short_window_min_calls
            and max(short_rates) > config.budget
        )
        main = "target"
        if target is not None:
            # 3b. efficiency: a cheaper threshold with (nearly) the same predicted P99.
            efficient = _efficient_target(config, base, estimate, target, observation, knobs)
            if efficient is not None:
                extra["efficiency"] = efficient[1]
                if efficient[0] > target:
                    target, main = efficient[0], "efficient_raise"
        if target is None and estimate.too_few_for_budget:
            # 3. no time is confidently under the budget, and counting the censored samples as
            #    first tokens would not change that: the samples are too few for this budget's
            #    tail. Raising would only follow noise; keep the value.
            proposed, codes = base, ["too_few_samples"]
        elif target is None and (estimate.max_censored_s is not None and base <= estimate.max_censored_s):
            # 3. the budget quantile is censored at or above the current value: raise by a
            #    bounded step (at most (1 + max_step_up) x the largest censoring time).
            proposed, codes = base * (1.0 + knobs.max_step_up), ["censored_raise"]
        elif target is None:
            # 3. censored, but the current value is already above every censoring time: the
            #    data cannot say more until calls at this value arrive; keep it.
            proposed, codes = base, ["censored_hold"]
        elif target > base:
            # 4. raise fast.
            proposed, codes = target, ["raise_over_budget" if short_over else main]
        elif target < base and short_over:
            # 4. over budget but the estimate says lower: do not lower now.
            proposed, codes = base, ["over_budget_hold"]
        else:
            # 5. lower slowly.
            floor = base * (1.0 - knobs.max_step_down)
            if target < floor:
                proposed, codes = floor, [main, "step_down_limited"]
            else:
                proposed, codes = target, [main]
        # 4. raise fast on the short window's own target: after a shift the long window's target
        #    lags by up to window_s; the last minutes' samples show the new tail at once.
        short_target = observation.short_window_target_s
        if short_over and short_target is not None and short_target > max(proposed, base):
            proposed, codes = short_target, ["raise_over_budget"]
        # 6. hysteresis (only against a published value).
        if current is not None and proposed != base and abs(proposed - base) / base < knobs.hysteresis:
            proposed, codes = base, ["hysteresis_hold"]

    # 7. clamp.
    if proposed < config.min_hedge_after_s:
        proposed, codes = config.min_hedge_after_s, [*codes, "clamped_min"]
    elif proposed > config.max_hedge_after_s:
        proposed, codes = config.max_hedge_after_s, [*codes, "clamped_max"]
    return _finish(proposed, current, codes, source, observation, knobs, extra)
