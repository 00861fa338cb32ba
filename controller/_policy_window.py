"""From one route's recent call records to the policy's ``Observation`` (pure, no I/O).

The controller job (``jobs.observe_route``, records read from the store) and the virtual-time
evaluation (``bench/controller_eval.py``, records from the simulation) both call
:func:`observe_window`, so the window rules exist once:

1. **Window.** The calls started in the last ``window_s`` (default 1 h); while they hold fewer
   than ``min_samples`` primary samples the window doubles up to ``max_window_s`` (24 h).
2. **Drift.** In an unwidened window, :func:`hedgerow.controller._policy_drift.detect_change`
   compares the recent minutes with the rest (log-rank, with a material change of the median);
   when it finds none, :func:`hedgerow.controller._policy_drift.detect_tail_recovery` tests
   whether the recent tail is lighter than the older one (a past queue). On either the window
   shrinks to the data since the change (``Observation.drift`` records the split and the
   evidence; ``drift["test"]`` is ``median`` or ``tail``).
3. **Estimate.** Kaplan-Meier over the window's primary samples (``estimation``), widening
   again while the samples are too few for the budget's tail (``too_few_for_budget``, or
   fewer than ``TAIL_SAMPLES`` (30) expected beyond the budget quantile: ``samples * budget``)
   and no change was detected. With ~18 samples beyond it (180 calls an hour at a 10% budget)
   the budget target moved by 10-30% from one tick to the next as single samples entered and
   left the window; 30 (300 samples at 10%) halves that noise's variance.
4. **Counts and curves.** Calls, hedges, backup wins and wanted hedges of the window and of the
   short window (5 min); the short window's primary samples (the policy's over-budget test);
   the call-level TTFT P99; the backup's KM curve (from the backup's own send) once there are
   ``min_backup_samples`` of them.

The sample rule (:func:`ttft_sample`) is here too: a first token is an observed duration, an
attempt cancelled before it is right-censored at its elapsed time, a failed attempt is no sample.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hedgerow.controller._policy_drift import detect_change, detect_tail_recovery
from hedgerow.controller.estimation import TTFTEstimate, estimate_ttft
from hedgerow.controller.hedge_model import SurvivalCurve, km_survival
from hedgerow.controller.policy import Observation

if TYPE_CHECKING:
    from hedgerow.controller.policy import PolicyKnobs

__all__ = ["TAIL_SAMPLES", "WindowRecords", "observe_window", "ttft_sample"]

#: Fewest samples expected beyond the budget quantile (``samples * budget``) before the window
#: stops widening.
TAIL_SAMPLES = 30


def ttft_sample(start_s: float, first_token_s: float | None, end_s: float, outcome: str) -> tuple[float, bool] | None:
    """One attempt as a TTFT sample measured from its own send: ``(duration_s, censored)``.

    Args:
        start_s / first_token_s / end_s: the attempt's times, seconds from the call's start
            (``first_token_s`` None without a first token).
        outcome: ``won``, ``cancelled`` or ``failed``.

    Returns:
        ``(first_token_s - start_s, False)`` with a first token; ``(end_s - start_s, True)``
        for an attempt cancelled before one; None for a failed attempt (fast failures would
        drag the estimate down).
    """
    if first_token_s is not None:
        return max(0.0, first_token_s - start_s), False
    if outcome == "cancelled":
        return max(0.0, end_s - start_s), True
    return None


@dataclass(frozen=True, slots=True)
class WindowRecords:
    """One route's calls of the span read (up to the widest window), one entry per call.

    Attributes (numpy arrays of one shape (n,)):
        age_s: seconds from the call's start to the tick's ``now`` (>= 0).
        primary_s: the primary's TTFT sample (``ttft_sample``), seconds; NaN when none.
        primary_censored: True where ``primary_s`` is a censoring time.
        hedged: the call sent a hedge (``hedge_reason == "ttft_timeout"``).
        backup_won: a hedged call whose backup won.
        denied: the client's bucket denied a wanted hedge (``hedge_denied``).
        backup_s: the hedge's backup TTFT sample from its own send, seconds; NaN when none.
        backup_censored: True where ``backup_s`` is a censoring time.
        call_ttft_s: the TTFT the app saw, seconds; NaN for failed calls and failovers.

    Raises:
        ValueError: arrays of different shapes.
    """

    age_s: np.ndarray
    primary_s: np.ndarray
    primary_censored: np.ndarray
    hedged: np.ndarray
    backup_won: np.ndarray
    denied: np.ndarray
    backup_s: np.ndarray
    backup_censored: np.ndarray
    call_ttft_s: np.ndarray

    def __post_init__(self) -> None:
        kinds = {"primary_censored": bool, "hedged": bool, "backup_won": bool, "denied": bool, "backup_censored": bool}
        shape = None
        for name in self.__dataclass_fields__:
            value = np.asarray(getattr(self, name), dtype=kinds.get(name, float))
            if shape is None:
                shape = value.shape
            if value.ndim != 1 or value.shape != shape:
                raise ValueError(f"WindowRecords.{name} has shape {value.shape}, expected {shape} (1-D)")
            object.__setattr__(self, name, value)

    @classmethod
    def from_rows(cls, rows: list[tuple[Any, ...]]) -> WindowRecords:
        """Build from tuples ``(age_s, primary_s, primary_censored, hedged, backup_won, denied,
        backup_s, backup_censored, call_ttft_s)`` (None for a missing duration)."""
        nan = float("nan")
        cols = list(zip(*rows, strict=True)) if rows else [()] * 9
        floats = {0, 1, 6, 8}
        arrays = [
            np.asarray([nan if v is None else v for v in col], dtype=float)
            if i in floats
            else np.asarray(col, dtype=bool)
            for i, col in enumerate(cols)
        ]
        return cls(*arrays)


def _estimate(records: WindowRecords, mask: np.ndarray, budget: float | None, confidence: float) -> TTFTEstimate | None:
    has = mask & ~np.isnan(records.primary_s)
    if not has.any():
        return None
    return estimate_ttft(records.primary_s[has], records.primary_censored[has], budget=budget, confidence=confidence)


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def observe_window(records: WindowRecords, *, settings: Any, budget: float | None, knobs: PolicyKnobs) -> Observation:
    """The policy's ``Observation`` of one route at one tick (see the module docstring).

    Args:
        records: the route's calls started up to ``settings.max_window_s`` before the tick
            (older ones are ignored).
        settings: a ``hedgerow.settings.Settings`` (``window_s``, ``max_window_s``,
            ``short_window_s``, ``min_samples``, ``confidence``, ``short_window_min_calls``).
        budget: the route's budget in (0, 1), or None (no target is computed).
        knobs: the ``policy.PolicyKnobs`` (``min_backup_samples``, ``drift_alpha``,
            ``drift_min_ratio``).

    Returns:
        A ``policy.Observation``.
    """
    age = records.age_s
    has_sample = ~np.isnan(records.primary_s)
    window = float(settings.window_s)
    max_window = max(float(settings.max_window_s), window)

    def in_window(span: float) -> np.ndarray:
        return (age >= 0) & (age < span)

    mask = in_window(window)
    while int((mask & has_sample).sum()) < settings.min_samples and window < max_window:
        window = min(window * 2, max_window)
        mask = in_window(window)
    drift: dict[str, Any] | None = None
    if window == float(settings.window_s) and knobs.drift_alpha > 0:
        sel = mask & has_sample
        samples = (age[sel], records.primary_s[sel], records.primary_censored[sel])
        tests = {
            "window_s": window,
            "min_samples": settings.min_samples,
            "alpha": knobs.drift_alpha,
            "min_ratio": knobs.drift_min_ratio,
        }
        change = detect_change(*samples, **tests)
        if change is not None:
            window = change.since_s
            drift = {
                "test": "median",
                "since_s": change.since_s,
                "statistic": change.statistic,
                "p_value": change.p_value,
                "median_ratio": change.median_ratio,
                "recent_samples": change.recent_samples,
                "older_samples": change.older_samples,
            }
        else:
            recovery = detect_tail_recovery(*samples, **tests, q=knobs.tail_quantile)
            if recovery is not None:
                window = recovery.since_s
                drift = {"test": "tail"} | dataclasses.asdict(recovery)
        if drift is not None:
            mask = in_window(window)
            # the change lies within the short window: the published value was set for the
            # old regime, so the policy follows the objective without its hold and step limit
            drift["fresh"] = window <= float(settings.short_window_s)
    estimate = _estimate(records, mask, budget, settings.confidence)

    while drift is None and estimate is not None and window < max_window:
        wider = min(window * 2, max_window)
        if not estimate.too_few_for_budget:
            # widen for the budget's tail only while that brings more samples
            thin = budget is not None and estimate.samples * budget < TAIL_SAMPLES
            if not thin or int((in_window(wider) & has_sample).sum()) == estimate.samples:
                break
        window = wider
        mask = in_window(window)
        estimate = _estimate(records, mask, budget, settings.confidence)

    # after a detected change the short window holds only data since it: its over-budget test
    # (rule 4) must not judge the new regime's value by the old regime's primaries
    short_span = float(settings.short_window_s) if drift is None else min(float(settings.short_window_s), window)
    short = in_window(short_span)
    short_sample = short & has_sample
    short_target_s = None
    if int(short.sum()) >= settings.short_window_min_calls and budget is not None and short_sample.any():
        short_estimate = estimate_ttft(
            records.primary_s[short_sample],
            records.primary_censored[short_sample],
            budget=budget,
            confidence=settings.confidence,
        )
        short_target_s = short_estimate.target_s
    calls = int(mask.sum())
    hedges = int((records.hedged & mask).sum())
    wins = int((records.backup_won & mask).sum())
    wanted = records.hedged | records.denied
    ttft = records.call_ttft_s[mask]
    ttft = ttft[~np.isnan(ttft)]
    backup_sel = mask & records.hedged & ~np.isnan(records.backup_s)
    backup_curve: SurvivalCurve | None = None
    if int(backup_sel.sum()) >= knobs.min_backup_samples and not records.backup_censored[backup_sel].all():
        backup_curve = km_survival(records.backup_s[backup_sel], records.backup_censored[backup_sel])
    window_sample = mask & has_sample
    order = np.argsort(-age[window_sample], kind="stable")  # arrival order: oldest first
    short_calls = int(short.sum())
    return Observation(
        estimate=estimate,
        window_s=window,
        calls=calls,
        observed_hedge_rate=_rate(hedges, calls),
        backup_win_rate=_rate(wins, hedges),
        hedges=hedges,
        short_window_calls=short_calls,
        short_window_hedge_rate=_rate(int((records.hedged & short).sum()), short_calls),
        call_ttft_samples=int(ttft.size),
        call_p99_s=float(np.quantile(ttft, 0.99, method="inverted_cdf")) if ttft.size else None,
        short_window_target_s=short_target_s,
        wanted_hedge_rate=_rate(int((wanted & mask).sum()), calls),
        short_window_wanted_rate=_rate(int((wanted & short).sum()), short_calls),
        primary_durations_s=tuple(records.primary_s[window_sample][order].tolist()),
        primary_censored=tuple(records.primary_censored[window_sample][order].tolist()),
        primary_started_s=tuple((-age[window_sample][order]).tolist()),
        backup_durations_s=tuple(records.backup_s[backup_sel].tolist()),
        backup_censored=tuple(records.backup_censored[backup_sel].tolist()),
        short_durations_s=tuple(records.primary_s[short_sample].tolist()),
        short_censored=tuple(records.primary_censored[short_sample].tolist()),
        backup_curve=backup_curve,
        drift=drift,
    )
