"""The controller's budget policy: from one window's observation to the hedge_after_s to publish.

``decide(config, current, observation, knobs)`` is pure (no I/O, no clock). It folds the rules
of :data:`hedgerow.controller.policy._policy_rules.RULES`, small functions ``(proposal, inputs) ->
proposal``, over a starting proposal (the current value, or the default when nothing was
published), in this order. The benchmark runs that chose each rule's design, and the current
figures of the scenario suite and the Azure replay, are in ``docs/evaluation.md``.

1. **Route state** (``route_state``). A disabled route keeps its value (or the default), source
   ``"disabled"``; a pinned route publishes the pinned value as is (no clamp), ``"pinned"``.
   A pin's value is the operator's, not the controller's: once the route is unpinned
   (``decide(..., current_source="pinned")``), the rules start from the default as if nothing
   were published, so a route with too few samples is a cold route again (rule 2). A
   published default (``current_source="default"``) that differs from the route's default
   now (the default was changed) is not kept either: rule 2 tests the new default.
2. **Small samples** (``small_sample``). With no estimate, fewer than ``knobs.min_samples``
   primary samples after the window widened (``_policy_window``: 1 h doubling up to 24 h), or
   too few for the budget's tail (``TTFTEstimate.too_few_for_budget``), no quantile is
   confident. The objective's constraint (the hedge rate within the budget with ~95%
   confidence) is then read with the distribution-free binomial bound: a value ``v`` is
   *supported* when the one-sided ``confidence`` Clopper-Pearson upper bound on the share of
   primaries known or possibly (censored earlier) still waiting at ``v`` is ``<= budget``
   (``_policy_rules.lowest_supported_value``). With ``n`` samples, none censored, that
   allows ``k`` of them past ``v`` once ``n`` reaches 29 (``k = 0``: ``1 - 0.05 ** (1 / n)``,
   0.101 at 28 and 0.098 at 29), 46 (``k = 1``), 61 (``k = 2``) at a 10% budget.
   **Cold route** (nothing published yet, or the published value is the default or an
   earlier cold-start value: source ``default`` or ``cold_start``, ``_policy_rules.COLD_SOURCES``;
   an unpinned route and a stale default count as nothing published): no objective has
   chosen a value yet, so none is kept for its own sake. The route publishes its default when
   the samples support it (``too_few_samples``, source ``default``), else the lowest value
   they support (``cold_start_supported``, binding ``budget``, source ``cold_start``): the
   route's maximum while none is (no samples, or fewer than 29 at a 10% budget), and lower
   as the samples grow, recomputed every tick (a bound the data support, so no step limit;
   it also rises at once when a slow sample arrives). Each tick looks again, so the level
   ``confidence`` is split over the looks at new order statistics that the cold period can
   take before ``min_samples`` (``_policy_rules.cold_start_confidence``, Bonferroni: at a 10%
   budget and 95%, the looks ``k = 0`` from 29 samples and ``k = 1`` from 46, each then at
   97.5%, where ``k = 0`` needs 36 samples and ``k = 1`` 54), so the whole cold period errs
   with at most ``1 - confidence``. Worked numbers (``tests/controller/policy/test_policy.py``): 35
   calls at 0.4 s and one at 6.0 s: 0 of 36 past 6.0 s gives 0.0974, 6.0 s; with 34 at 0.4 s,
   0 of 35 gives 0.1000, so still the maximum; 47 at 0.4 s, one at 3.0 s and one at 6.0 s:
   1 of 49 past 3.0 s is not supported at 97.5% (it is at 95% from 46), so 6.0 s.
   **A value the objective chose** (source ``controller``) is kept (``too_few_samples``)
   while the samples are consistent with it: the one-sided ``confidence`` Clopper-Pearson
   lower bound on the share of primaries known to have waited past it
   (``_policy_rules.known_over``) must not exceed the budget. When it does, the value is
   raised (``small_sample_raise``, binding ``evidence``) to the lowest supported value above
   it (``_policy_rules.supported_value``), or to the route's maximum (``clamped_max``) when
   none is (or primaries censored near the value leave their fate unknown). Worked numbers:
   20 calls at 2.0 s, 5 of them known to have waited past 2.0 s: lower bound 0.104 > 0.10,
   raise to the maximum; 3 of 20 (0.042): keep; 40 calls, 10 past 2.0 s (0.142): raise to
   the slowest sample, where 0 of 40 gives 0.072.
3. **One objective** (``objective``). Among thresholds ``t`` in ``[min, max]`` whose upper
   confidence bound on ``S(t) = P(TTFT > t)`` is ``<= budget`` (the hedge rate stays within the
   budget with ~97.5% one-sided confidence; that set is ``[target_s, max]``, ``target_s`` from
   ``estimation``), take the one with the lowest predicted call tail quantile
   (``knobs.tail_quantile``, P99 by default) from the primary's and the backup's survival
   curves with the clients' token bucket replayed (``hedge_model.efficient_threshold``, 96
   geometric points); cost (extra hedges) breaks ties towards the largest ``t`` whose
   predicted tail is within ``knobs.p99_tolerance`` (2%) of the lowest. The main code names
   the binding constraint: ``budget_bound`` (the value is at the budget's edge: a lower one
   would risk the budget), ``tail_min`` (the predicted tail is lowest there, above the
   budget's edge), ``cost_tie`` (a higher, cheaper value within the tolerance). There is no
   separate "move to the P99" rule: when backups rarely win, the model sees it (its backup
   curve), and a high threshold wins only if the predicted tail says so.
   **Minute aggregates.** The live tick reads each duration at its histogram bucket's end
   (4.7 % wide), so its curves step only there and their predicted tails move in 4.7 % jumps,
   coarser than the 2 % tolerance. The predictions (not the budget target) therefore spread
   each step over the interval since the previous step, within its bucket or across empty
   buckets (``_policy_rules.spread_steps``; on 20,000 lognormal calls the predicted P99 comes
   within 0.8 % of the raw calls' instead of 4.5 %). Curves of raw calls are used as they are.
   **Replay hold.** When the search is bucket-limited (``hedge_model.efficient_threshold``: the
   budget target's predicted tail is worse than the lowest because the replayed bucket runs
   dry there) and its value lies above the current one, the current value is kept
   (``replay_hold``, binding ``replay``). The replay holds the primaries as they were under the
   current value: it cannot see that a lower threshold drains an overloaded upstream's queue
   (its backups win and cancel the slow primaries) nor that a higher one lets it grow, so its
   error favours higher thresholds and its prediction is self-consistent only at the current
   value. A raise in that regime comes from the budget's evidence (rule 4).
   **Censored region.** When no time qualifies because the budget quantile lies where the
   primaries were cancelled (``target_s`` None, the value at or below the largest censoring
   time), the value moves to the lowest one the data can support,
   ``KMCurve.lowest_supported_s``: the first time whose one-sided lower bound on ``S`` is
   ``<= budget`` (below it the data show the budget exceeded), ``censored_raise``; not by
   doubling. Above every censoring time it is held, ``censored_hold``.
4. **Evidence of over budget** (``over_budget_evidence``). The short window's primaries (last
   ``short_window_s``, at least ``short_window_min_calls`` calls) test the proposed value ``v``:
   ``x`` = those known to have waited past ``v`` (a hedge fired at a threshold ``>= v``
   always counts; one fired below ``v`` only when its primary was seen still waiting at
   ``v``), ``n`` = the samples; when the one-sided Clopper-Pearson lower bound on ``x / n``
   exceeds the budget, ``v`` is raised to the smallest value the same test accepts
   (``_policy_rules.least_accepted_value``; ``raise_over_budget``, binding ``evidence``): a
   value the rule accepts from the objective is one it accepts from itself, and the window's
   budget bound (rule 3) is what holds a value within the budget with confidence. A raw
   proportion over the budget is not enough: 31 of 300 (10.3%) gives a lower bound of 0.076
   and no raise. After a detected change the short window holds only data since the change.
5. **Stability** (``stability``, only against a published value). A proposal of the objective
   is not followed (``hysteresis_hold``) while the current value is within the budget (the
   one-sided ``confidence`` upper bound on ``S`` there, ``KMCurve.upper_one_sided``, is
   ``<= budget``: a new value must meet the stricter two-sided bound of the target, a kept one
   the one-sided bound, so a value at the target is not pushed out by the next sample) and
   the short window does not show it over budget, and either (a) its predicted tail is not
   shown worse than the proposal's: the two predictions rest on the same samples, so they are
   compared at the same levels, those of ``quantile_level_band(n, q)`` (the order-statistic
   band of the ``q`` quantile: P97.5, P99, P99.7 for 160 samples; P98.83, P99, P99.16 for
   10,000), and the current is shown worse only when its predicted quantile exceeds the
   proposal's by more than ``p99_tolerance`` at every level of the band; or (b) the proposal
   is a decrease and the current value lies no further above the budget target than the
   target lies above the KM budget quantile (the target's own sampling noise). Any change
   under ``knobs.hysteresis`` (5%) relative is held, except raises on evidence; a decrease of
   a value inside the objective's search range is cut to ``current * (1 - max_step_down)``
   (``step_down_limited``); a value above it (at or above the primary's own tail quantile, as
   after a small sample's raise to the maximum) is no candidate: it is not stepped down but
   left in one step, and it is not held when the proposal's predicted tail is lower by more
   than ``p99_tolerance`` at the quantile itself (the band's lower levels cannot show that,
   since a level whose primary quantile lies below the proposal predicts the same for both).
   Worked number (``tests/controller/policy/test_policy.py``, 80 lognormal samples): predicted
   P99 7.41 s at 30 s against 7.23 s at the proposal (2.4% lower), and the same 6.18 s at P97.5.
   Against a proposal with the same predicted tail (e.g. the search's top, the primary's own
   tail quantile) such a value is held.
   Neither hold nor step limit applies while a detected change is fresh (within the short
   window): the value then belongs to the old regime.
   **Window looks.** A decrease goes no lower than ``_policy_rules.looks_target`` (cut:
   ``step_down_limited``; held when it lies at or above the current value: ``hysteresis_hold``;
   binding ``looks`` either way): the first time whose upper bound on ``S`` is within the
   budget at the level that holds over one window's looks, not one look. The tick looks every
   minute at a sliding window, so the budget target (97.5% at one look) dips below the true
   quantile at some tick of a long run far more often than 2.5%; a value that follows the
   target down follows those dips and the one-sided hold above keeps it there. Over one window
   span the window's error behaves like a Slepian process and passes ``u`` with probability
   about ``Phi_bar(u) + u phi(u)`` (``_policy_rules.window_scan_ratio``): 2.5% at ``u`` =
   2.795 instead of 1.960, a log-log half-width 1.426 times the target's. A raise is not
   limited: the value enters at 2.795 and leaves at the one-sided 1.645.
6. **Clamp** (``clamp``) to ``[min_hedge_after_s, max_hedge_after_s]``; a value at a bound
   always carries ``clamped_min`` / ``clamped_max`` (also when the search itself stopped there).
7. **Drift note** (``drift_note``): ``drift_window`` when the window was shrunk to the data since
   a detected change of the primary's TTFT distribution, or since its tail recovered from a
   past queue (``_policy_drift``).

Then flags (every path, once ``hedges >= min_hedges_for_flag``): ``backups_rarely_win`` (backup
win rate under ``min_backup_win_rate``: the backup probably shares the primary's queue) and
``hedges_did_not_lower_p99`` (call-level P99 not ``min_p99_improvement`` below the primary's
KM P99, or its one-sided lower bound when unidentified; inputs in ``details["p99_check"]``).
``Decision.details["binding"]`` names the constraint that set the value; the rules' inputs go
to ``details`` too (``objective``, ``censored``, ``small_sample_test``, ``over_budget_test``,
``drift``).

``applied`` is True when the published value changes (always when nothing was published).

Reason codes (``Decision.reason`` is comma-separated, main code first): each code and its
meaning is in :data:`hedgerow.controller.policy.reason_codes.REASON_MEANINGS` (one copy, which the ops
pages and the CLI show too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hedgerow.controller.policy._policy_rules import RULES, Inputs, Proposal
from hedgerow.controller.policy.estimation import TTFTEstimate
from hedgerow.controller.policy.hedge_model import SurvivalCurve
from hedgerow.controller.policy.reason_codes import REASON_CODES
from hedgerow.controller.policy.route_config import RouteConfig, check_count, check_fraction, check_positive, is_number

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "REASON_CODES",
    "SHORT_WINDOW_MIN_CALLS",
    "SOURCES",
    "Decision",
    "Observation",
    "PolicyKnobs",
    "RouteConfig",
    "decide",
]

#: The sources a published value may carry (``thresholds.source``; ``decide`` gives all but
#: ``manual``; ``cold_start``: rule 2's value on a cold route).
SOURCES = frozenset({"controller", "cold_start", "default", "pinned", "disabled", "manual"})

#: Fewest calls in the short window before it is tested for over budget (rule 4).
SHORT_WINDOW_MIN_CALLS = 20


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """Controller-wide tuning of ``decide`` (from ``hedgerow.settings.Settings``).

    Attributes:
        min_samples: fewest primary TTFT samples (censored included) for a decision.
        hysteresis: relative change below which the published value is held, in [0, 1).
        max_step_down: largest relative decrease per tick, in [0, 1) (0.25: to 75% at most).
        confidence: level of the binomial bounds of rules 2 and 4 (one-sided), in (0, 1).
        tail_quantile: the call TTFT quantile the objective minimises, in (0.5, 1) (0.99: P99).
        drift_alpha: false-alarm level of the drift test over its splits, in [0, 1); 0 turns
            drift detection off (``_policy_drift``).
        drift_min_ratio: smallest ratio of KM medians that counts as a change, >= 1.
        min_backup_win_rate: below this backup win rate the route is flagged, in [0, 1].
        min_hedges_for_flag: fewest hedges in the window before a flag can fire.
        short_window_min_calls: fewest calls in the short window before its hedge rate is
            trusted (rule 4), >= 1.
        min_p99_improvement: fraction by which the call-level P99 TTFT must undercut the
            primary's KM P99, else ``hedges_did_not_lower_p99``, in [0, 1).
        p99_tolerance: rule 3: relative slack on the predicted call P99 within which a higher
            (cheaper) threshold than the budget target is preferred, >= 0 (0: only exact ties).
        min_backup_samples: fewest backup TTFT samples for the backup's own survival curve in
            rule 3; with fewer, the primary's curve stands in for it, >= 1.
        client_budget_burst: capacity (tokens) of the clients' hedge bucket assumed by the objective's
            bucket replay, >= 0; 0 leaves the bucket's denials out of the prediction.
        replay_max_calls: most calls the observation keeps for rules 2 and 3 (the window's
            latest, in arrival order), >= 1: the bucket replay costs time per call, and the
            curves it is combined with come from the whole window.

    Raises:
        ValueError: a field out of range (named in the message).
    """

    min_samples: int = 50
    hysteresis: float = 0.05
    max_step_down: float = 0.25
    confidence: float = 0.95
    tail_quantile: float = 0.99
    drift_alpha: float = 1e-3
    drift_min_ratio: float = 1.75
    min_backup_win_rate: float = 0.2
    min_hedges_for_flag: int = 20
    short_window_min_calls: int = SHORT_WINDOW_MIN_CALLS
    min_p99_improvement: float = 0.05
    p99_tolerance: float = 0.02
    min_backup_samples: int = 20
    client_budget_burst: float = 10.0
    replay_max_calls: int = 4000

    def __post_init__(self) -> None:
        if not isinstance(self.min_samples, int) or isinstance(self.min_samples, bool) or (self.min_samples < 1):
            raise ValueError(f"min_samples must be an integer >= 1, got {self.min_samples!r}")
        check_fraction("hysteresis", self.hysteresis, low_open=False, high_open=True)
        check_fraction("max_step_down", self.max_step_down, low_open=False, high_open=True)
        check_fraction("confidence", self.confidence, low_open=True, high_open=True)
        if not is_number(self.tail_quantile) or not 0.5 < self.tail_quantile < 1:
            raise ValueError(f"tail_quantile must be in (0.5, 1), got {self.tail_quantile!r}")
        check_fraction("drift_alpha", self.drift_alpha, low_open=False, high_open=True)
        if not is_number(self.drift_min_ratio) or not (
            math.isfinite(self.drift_min_ratio) and self.drift_min_ratio >= 1
        ):
            raise ValueError(f"drift_min_ratio must be a finite number >= 1, got {self.drift_min_ratio!r}")
        check_fraction("min_backup_win_rate", self.min_backup_win_rate, low_open=False, high_open=False)
        check_count("min_hedges_for_flag", self.min_hedges_for_flag)
        check_count("short_window_min_calls", self.short_window_min_calls)
        if self.short_window_min_calls < 1:
            raise ValueError(f"short_window_min_calls must be an integer >= 1, got {self.short_window_min_calls!r}")
        check_fraction("min_p99_improvement", self.min_p99_improvement, low_open=False, high_open=True)
        if not is_number(self.p99_tolerance) or not (math.isfinite(self.p99_tolerance) and self.p99_tolerance >= 0):
            raise ValueError(f"p99_tolerance must be a finite number >= 0, got {self.p99_tolerance!r}")
        check_count("min_backup_samples", self.min_backup_samples)
        if not is_number(self.client_budget_burst) or not (
            math.isfinite(self.client_budget_burst) and self.client_budget_burst >= 0
        ):
            raise ValueError(f"client_budget_burst must be a finite number >= 0, got {self.client_budget_burst!r}")
        if self.min_backup_samples < 1:
            raise ValueError(f"min_backup_samples must be an integer >= 1, got {self.min_backup_samples!r}")
        check_count("replay_max_calls", self.replay_max_calls)
        if self.replay_max_calls < 1:
            raise ValueError(f"replay_max_calls must be an integer >= 1, got {self.replay_max_calls!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyKnobs:
        """Build the knobs from a ``hedgerow.settings.Settings``.

        Args:
            settings: the settings object; its ``min_samples``, ``hysteresis``,
                ``max_step_down``, ``confidence``, ``tail_quantile``, ``drift_alpha``,
                ``drift_min_ratio``, ``min_backup_win_rate``,
                ``min_hedges_for_flag``, ``short_window_min_calls``, ``min_p99_improvement``,
                ``p99_tolerance``, ``min_backup_samples``, ``client_budget_burst`` and
                ``replay_max_calls`` are read.

        Returns:
            The knobs.

        Raises:
            ValueError: a setting out of range (named in the message).
        """
        return cls(
            min_samples=settings.min_samples,
            hysteresis=settings.hysteresis,
            max_step_down=settings.max_step_down,
            confidence=settings.confidence,
            tail_quantile=settings.tail_quantile,
            drift_alpha=settings.drift_alpha,
            drift_min_ratio=settings.drift_min_ratio,
            min_backup_win_rate=settings.min_backup_win_rate,
            min_hedges_for_flag=settings.min_hedges_for_flag,
            short_window_min_calls=settings.short_window_min_calls,
            min_p99_improvement=settings.min_p99_improvement,
            p99_tolerance=settings.p99_tolerance,
            min_backup_samples=settings.min_backup_samples,
            client_budget_burst=settings.client_budget_burst,
            replay_max_calls=settings.replay_max_calls,
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
        short_window_wanted_rate: the same in the short window, or ``None`` (reported only).
        primary_durations_s / primary_censored: the primary TTFT samples behind ``estimate``
            (seconds; True = censored), shape (n,) each, in the calls' arrival order; rule 2
            counts them (binomial bound) and rule 3 replays the clients' bucket over them.
        primary_started_s: when each primary sample's call started, seconds on any common
            clock, shape (n,) or empty; with it, rule 3 replays the client's hedge bucket over
            the calls in that order (hedges it would deny are part of the prediction).
        short_durations_s / short_censored: the primary samples of the short window (rule 4's
            binomial test), shape (k,) each.
        backup_curve: the backup's KM survival curve from its own send (``_policy_window``),
            or None with too few backup samples (the primary's curve stands in).
        drift: the detected change when the window was shrunk to the data since it, or None:
            ``test`` (``median``: ``since_s``, ``statistic``, ``p_value``, ``median_ratio``,
            sample counts; ``tail``: the fields of ``_policy_drift.TailRecovery``) and
            ``fresh`` (the change lies within the short window).
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
    short_durations_s: tuple[float, ...] = ()
    short_censored: tuple[bool, ...] = ()
    backup_curve: SurvivalCurve | None = None
    drift: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.estimate is not None and not isinstance(self.estimate, TTFTEstimate):
            raise ValueError(f"estimate must be a TTFTEstimate or None, got {self.estimate!r}")
        check_positive("window_s", self.window_s)
        check_count("calls", self.calls)
        check_count("hedges", self.hedges)
        check_count("short_window_calls", self.short_window_calls)
        check_count("call_ttft_samples", self.call_ttft_samples)
        if self.short_window_target_s is not None:
            check_positive("short_window_target_s", self.short_window_target_s)
        if self.call_p99_s is not None and (
            not is_number(self.call_p99_s) or not math.isfinite(self.call_p99_s) or self.call_p99_s < 0
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
                check_fraction(name, value, low_open=False, high_open=False)
        for kind in ("primary", "backup", "short"):
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
    bound = estimate.quantile_lower_bound_s(0.99)
    primary_p99_s = estimate.p99_s if estimate.p99_s is not None else bound
    if primary_p99_s is None:
        return codes, details
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


def _finish(p: Proposal, current: float | None, observation: Observation, knobs: PolicyKnobs) -> Decision:
    """Add the flags and build the ``Decision`` (``applied`` from comparing with current)."""
    flag_codes, details = _flags(observation, knobs)
    return Decision(
        hedge_after_s=float(p.value),
        applied=current is None or p.value != current,
        reason=",".join([*p.codes, *flag_codes]),
        source=p.source,
        details=p.details | details | {"binding": p.binding},
    )


def decide(
    config: RouteConfig,
    current_hedge_after_s: float | None,
    observation: Observation,
    knobs: PolicyKnobs,
    *,
    current_source: str | None = None,
) -> Decision:
    """Decide the ``hedge_after_s`` to publish for one (route, model) this tick.

    Args:
        config: the route's configuration.
        current_hedge_after_s: the value published now, seconds; ``None`` when nothing was
            published yet (the default is the starting point).
        observation: what the tick measured; ``observation.estimate`` must have been computed
            with ``budget=config.budget``.
        knobs: the policy knobs.
        current_source: who set ``current_hedge_after_s`` (the published threshold's source:
            ``controller``, ``cold_start``, ``default``, ``pinned`` or ``disabled``), or None
            (taken as the controller's). ``default`` and ``cold_start`` mark a cold route
            (rule 2: no objective value yet). ``pinned`` on a route that is no longer pinned
            means the value is the operator's, not the controller's: the rules then start from
            the default as if nothing were published (no incumbent to keep), so an unpinned
            route with too few samples is cold again; ``applied`` still compares with the
            published value. ``default`` likewise when the value is no longer the route's
            default, and a default kept for too few samples keeps the source ``default``.

    Returns:
        The ``Decision`` (value, applied, reason codes, source, details with the binding
        constraint); see the module docstring for the rules and codes.

    Raises:
        TypeError: ``config``, ``observation`` or ``knobs`` of the wrong type (named).
        ValueError: ``current_hedge_after_s`` not a finite number > 0, ``current_source`` not a
            known source, or the estimate's budget differs from ``config.budget`` (the message
            names the argument).
    """
    if not isinstance(config, RouteConfig):
        raise TypeError(f"config must be a RouteConfig, got {type(config).__name__}")
    if not isinstance(observation, Observation):
        raise TypeError(f"observation must be an Observation, got {type(observation).__name__}")
    if not isinstance(knobs, PolicyKnobs):
        raise TypeError(f"knobs must be a PolicyKnobs, got {type(knobs).__name__}")
    if current_hedge_after_s is not None:
        check_positive("current_hedge_after_s", current_hedge_after_s)
    if current_source is not None and current_source not in SOURCES:
        raise ValueError(f"current_source must be one of {sorted(SOURCES)} or None, got {current_source!r}")
    estimate = observation.estimate
    if (
        config.enabled
        and config.pinned_hedge_after_s is None
        and estimate is not None
        and (estimate.budget is None or not math.isclose(estimate.budget, config.budget))
    ):
        raise ValueError(
            f"observation.estimate.budget ({estimate.budget!r}) must equal config.budget"
            f" ({config.budget!r}): the target is only meaningful for the route's budget"
        )
    current = None if current_hedge_after_s is None else float(current_hedge_after_s)
    # a pin is the operator's value: once unpinned, the controller has no value of its own yet;
    # nor is a published default that the route's default no longer equals
    unpinned = current_source == "pinned" and config.pinned_hedge_after_s is None
    stale_default = current_source == "default" and current != config.default_hedge_after_s
    own = None if unpinned or stale_default else current
    base = config.default_hedge_after_s if own is None else own
    inputs = Inputs(config, own, base, observation, knobs, current_source)
    proposal = Proposal(base, (), "controller", "samples")
    for rule in RULES:
        proposal = rule(proposal, inputs)
    return _finish(proposal, current, observation, knobs)
