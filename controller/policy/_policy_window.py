"""From one route's recent call records to the policy's ``Observation`` (pure, no I/O).

The controller job (``jobs.observe_route``, records read from the store) and the virtual-time
evaluation (``bench/controller_eval.py``, records from the simulation) both call
:func:`observe_window`, so the window rules exist once:

1. **Window.** The calls started in the last ``window_s`` (default 1 h); while they hold fewer
   than ``min_samples`` primary samples the window doubles up to ``max_window_s`` (24 h).
2. **Drift.** In an unwidened window, :func:`hedgerow.controller.policy._policy_drift.detect_change`
   compares the recent minutes with the rest (log-rank, with a material change of the median);
   when it finds none, :func:`hedgerow.controller.policy._policy_drift.detect_tail_recovery` tests
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
   ``min_backup_samples`` of them; the window's latest ``knobs.replay_max_calls`` primaries one
   per call in arrival order (rules 2 and 3: the binomial counts of small samples and the
   bucket replay, whose cost grows with the calls it replays).

The input is one entry per call (:class:`WindowRecords`) or weighted entries (:class:`WindowData`:
samples of each kind with a weight, counters by age), such as a histogram's (minute, bucket, count)
entries. A weight is that many calls of the same age and duration, so the same rules give the same
observation from either form of the same calls (``tests/controller/policy/test_policy_window.py``), at the
cost of the entries instead of the calls.

The sample rule (:func:`ttft_sample`) is here too: a first token is an observed duration, an
attempt cancelled before it is right-censored at its elapsed time, a failed attempt is no sample.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hedgerow.controller.policy._policy_drift import detect_change, detect_tail_recovery
from hedgerow.controller.policy.estimation import TTFTEstimate, estimate_ttft
from hedgerow.controller.policy.hedge_model import SurvivalCurve, km_survival
from hedgerow.controller.policy.policy import Observation
from hedgerow.controller.policy.samples import ttft_sample

if TYPE_CHECKING:
    from hedgerow.controller.policy.policy import PolicyKnobs
    from hedgerow.settings import Settings

__all__ = [
    "TAIL_SAMPLES",
    "CallCounts",
    "Samples",
    "WindowData",
    "WindowRecords",
    "concat_window_data",
    "observe_window",
    "ttft_sample",
]

#: Fewest samples expected beyond the budget quantile (``samples * budget``) before the window
#: stops widening.
TAIL_SAMPLES = 30


@dataclass(frozen=True, slots=True)
class Samples:
    """Weighted TTFT samples of one kind: one entry per call, or per (minute, bucket) of a histogram.

    Attributes (numpy arrays of one shape (n,)):
        age_s: seconds from the call's start to the tick's ``now`` (>= 0).
        durations_s: the samples (``ttft_sample``), seconds.
        censored: True where the duration is a censoring time.
        weight: how many calls the entry stands for (whole numbers >= 1).

    Raises:
        ValueError: arrays of different shapes.
    """

    age_s: np.ndarray
    durations_s: np.ndarray
    censored: np.ndarray
    weight: np.ndarray

    def __post_init__(self) -> None:
        _as_arrays(self, {"censored": bool})

    def within(self, span_s: float) -> np.ndarray:
        """Mask of the entries whose call started in the last ``span_s`` seconds, shape (n,)."""
        return (self.age_s >= 0) & (self.age_s < span_s)

    def count(self, mask: np.ndarray) -> int:
        """How many calls the masked entries stand for."""
        return int(self.weight[mask].sum())

    def weights_of(self, mask: np.ndarray) -> np.ndarray | None:
        """The masked entries' weights, or None when each is 1 (one entry per call)."""
        w = self.weight[mask]
        return None if bool(np.all(w == 1.0)) else w

    def expanded(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The masked entries as one sample per call, in entry order: ``(durations_s,
        censored, age_s)``, each repeated by its weight."""
        repeats = self.weight[mask].astype(np.int64)
        return (
            np.repeat(self.durations_s[mask], repeats),
            np.repeat(self.censored[mask], repeats),
            np.repeat(self.age_s[mask], repeats),
        )


@dataclass(frozen=True, slots=True)
class CallCounts:
    """Call counters by age: one entry per call, or per minute of the minute aggregates.

    Attributes (numpy arrays of one shape (g,)):
        age_s: seconds from the calls' start to the tick's ``now``.
        calls: calls; hedged: of them ``hedge_reason == "ttft_timeout"``; backup_wins: hedged
            calls the backup won; denied: calls whose wanted hedge the client's bucket denied;
            wanted: hedged or denied.

    Raises:
        ValueError: arrays of different shapes.
    """

    age_s: np.ndarray
    calls: np.ndarray
    hedged: np.ndarray
    backup_wins: np.ndarray
    denied: np.ndarray
    wanted: np.ndarray

    def __post_init__(self) -> None:
        _as_arrays(self, {})

    def within(self, span_s: float) -> np.ndarray:
        """Mask of the entries whose calls started in the last ``span_s`` seconds."""
        return (self.age_s >= 0) & (self.age_s < span_s)

    def sum(self, name: str, mask: np.ndarray) -> int:
        """One counter summed over the masked entries."""
        return int(getattr(self, name)[mask].sum())


@dataclass(frozen=True, slots=True)
class WindowData:
    """What :func:`observe_window` reads of one route: its samples and counters by age.

    Built from one entry per call (:meth:`WindowRecords.data`) or from weighted entries (a
    histogram's buckets); the window rules are the same code either way.

    Attributes:
        primary: the primaries' TTFT samples.
        backup: the hedges' backup TTFT samples, from the backup's own send.
        call_ttft: the TTFTs the app saw (failed calls and failovers left out; never censored).
        counts: the call counters.
    """

    primary: Samples
    backup: Samples
    call_ttft: Samples
    counts: CallCounts


def concat_window_data(*parts: WindowData) -> WindowData:
    """Several :class:`WindowData` of one route as one (their entries side by side)."""

    def join(kind: str) -> Samples:
        pieces = [getattr(part, kind) for part in parts]
        return Samples(*(np.concatenate([getattr(p, f) for p in pieces]) for f in Samples.__dataclass_fields__))

    counts = [part.counts for part in parts]
    return WindowData(
        primary=join("primary"),
        backup=join("backup"),
        call_ttft=join("call_ttft"),
        counts=CallCounts(*(np.concatenate([getattr(c, f) for c in counts]) for f in CallCounts.__dataclass_fields__)),
    )


def _as_arrays(instance: Any, kinds: dict[str, type]) -> None:
    """Turn every field of a frozen dataclass into a 1-D array of one shape (float unless
    ``kinds`` says otherwise); raise ValueError naming the first field that differs."""
    shape = None
    for name in instance.__dataclass_fields__:
        value: np.ndarray = np.asarray(getattr(instance, name), dtype=kinds.get(name, float))
        if shape is None:
            shape = value.shape
        if value.ndim != 1 or value.shape != shape:
            raise ValueError(f"{type(instance).__name__}.{name} has shape {value.shape}, expected {shape} (1-D)")
        object.__setattr__(instance, name, value)


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
        flags = ("primary_censored", "hedged", "backup_won", "denied", "backup_censored")
        _as_arrays(self, dict.fromkeys(flags, bool))

    def select(self, mask: np.ndarray) -> WindowRecords:
        """The records where ``mask`` (bool, shape (n,)) is True."""
        return WindowRecords(*(getattr(self, name)[mask] for name in self.__dataclass_fields__))

    def data(self) -> WindowData:
        """The records as :class:`WindowData`, one entry (weight 1) per call and sample."""
        age = self.age_s
        ones = np.ones(age.size)
        primary = ~np.isnan(self.primary_s)
        backup = self.hedged & ~np.isnan(self.backup_s)
        ttft = ~np.isnan(self.call_ttft_s)
        return WindowData(
            primary=Samples(age[primary], self.primary_s[primary], self.primary_censored[primary], ones[primary]),
            backup=Samples(age[backup], self.backup_s[backup], self.backup_censored[backup], ones[backup]),
            call_ttft=Samples(age[ttft], self.call_ttft_s[ttft], np.zeros(int(ttft.sum()), dtype=bool), ones[ttft]),
            counts=CallCounts(age, ones, self.hedged, self.backup_won, self.denied, self.hedged | self.denied),
        )

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


def _estimate(primary: Samples, mask: np.ndarray, budget: float | None, confidence: float) -> TTFTEstimate | None:
    if not mask.any():
        return None
    return estimate_ttft(
        primary.durations_s[mask],
        primary.censored[mask],
        budget=budget,
        confidence=confidence,
        weights=primary.weights_of(mask),
    )


def _latest_in_order(primary: Samples, mask: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The masked primaries one per call in arrival order (oldest first), the latest ``limit``.

    Entries of one age (a histogram's buckets of one minute) stand for calls whose order within
    the minute is unknown; they are put in a fixed pseudo-random order (seed 0), not by duration,
    so that slow calls are not bunched at the end of each minute in the bucket replay.

    Only the entries at least as young as the ``limit``-th youngest call are expanded and
    sorted (a suffix of the order of all the masked calls), each call keeping the pseudo-random
    key it draws among all of them: the result is that of sorting every masked call, at a cost
    that grows with the entries, not with the calls they stand for.

    Returns:
        ``(durations_s, censored, age_s)``, each of shape (min(calls, limit),).
    """
    index = np.flatnonzero(mask)
    weights = primary.weight[index].astype(np.int64)
    ages = primary.age_s[index]
    keep = np.ones(index.size, dtype=bool)
    if int(weights.sum()) > limit:
        youngest = np.argsort(ages, kind="stable")
        reached = int(np.searchsorted(np.cumsum(weights[youngest]), limit))
        keep = ages <= ages[youngest[reached]]
    durations, censored, age = primary.expanded(index[keep])
    if primary.weights_of(mask) is None:
        order = np.argsort(-age, kind="stable")
    else:
        # the key each kept call draws in the order of all the masked calls
        keys = np.random.default_rng(0).random(int(weights.sum()))
        first = (np.cumsum(weights) - weights)[keep]
        kept = weights[keep]
        within = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        order = np.lexsort((keys[np.repeat(first, kept) + within], -age))
    order = order[-limit:]
    return durations[order], censored[order], age[order]


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose weighted empirical CDF is ``>= q`` (numpy's ``inverted_cdf``
    with unit weights)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, q * cumulative[-1], side="left"))
    return float(values[order][min(index, values.size - 1)])


def observe_window(
    records: WindowRecords | WindowData, *, settings: Settings, budget: float | None, knobs: PolicyKnobs
) -> Observation:
    """The policy's ``Observation`` of one route at one tick (see the module docstring).

    Args:
        records: the route's calls started up to ``settings.max_window_s`` before the tick
            (older ones are ignored), one entry per call (``WindowRecords``) or as weighted
            samples and counters (``WindowData``).
        settings: a ``hedgerow.settings.Settings`` (``window_s``, ``max_window_s``,
            ``short_window_s``, ``min_samples``, ``confidence``, ``short_window_min_calls``).
        budget: the route's budget in (0, 1), or None (no target is computed).
        knobs: the ``policy.PolicyKnobs`` (``min_backup_samples``, ``drift_alpha``,
            ``drift_min_ratio``).

    Returns:
        A ``policy.Observation``.
    """
    data = records.data() if isinstance(records, WindowRecords) else records
    primary, counts = data.primary, data.counts
    window = float(settings.window_s)
    max_window = max(float(settings.max_window_s), window)

    mask = primary.within(window)
    while primary.count(mask) < settings.min_samples and window < max_window:
        window = min(window * 2, max_window)
        mask = primary.within(window)
    drift: dict[str, Any] | None = None
    if window == float(settings.window_s) and knobs.drift_alpha > 0:
        samples = (primary.age_s[mask], primary.durations_s[mask], primary.censored[mask])
        tests: dict[str, Any] = {
            "window_s": window,
            "min_samples": settings.min_samples,
            "alpha": knobs.drift_alpha,
            "min_ratio": knobs.drift_min_ratio,
            "weights": primary.weights_of(mask),
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
            mask = primary.within(window)
            # the change lies within the short window: the published value was set for the
            # old regime, so the policy follows the objective without its hold and step limit
            drift["fresh"] = window <= float(settings.short_window_s)
    estimate = _estimate(primary, mask, budget, settings.confidence)

    while drift is None and estimate is not None and window < max_window:
        wider = min(window * 2, max_window)
        if not estimate.too_few_for_budget:
            # widen for the budget's tail only while that brings more samples
            thin = budget is not None and estimate.samples * budget < TAIL_SAMPLES
            if not thin or primary.count(primary.within(wider)) == estimate.samples:
                break
        window = wider
        mask = primary.within(window)
        estimate = _estimate(primary, mask, budget, settings.confidence)

    # after a detected change the short window holds only data since it: its over-budget test
    # (rule 4) must not judge the new regime's value by the old regime's primaries
    short_span = float(settings.short_window_s) if drift is None else min(float(settings.short_window_s), window)
    short = counts.within(short_span)
    short_sample = primary.within(short_span)
    short_calls = counts.sum("calls", short)
    short_target_s = None
    if short_calls >= settings.short_window_min_calls and budget is not None and short_sample.any():
        short_estimate = _estimate(primary, short_sample, budget, settings.confidence)
        short_target_s = None if short_estimate is None else short_estimate.target_s
    in_window = counts.within(window)
    calls = counts.sum("calls", in_window)
    hedges = counts.sum("hedged", in_window)
    wins = counts.sum("backup_wins", in_window)
    ttft_mask = data.call_ttft.within(window)
    ttft_n = data.call_ttft.count(ttft_mask)
    backup = data.backup
    backup_sel = backup.within(window)
    backup_curve: SurvivalCurve | None = None
    if backup.count(backup_sel) >= knobs.min_backup_samples and not backup.censored[backup_sel].all():
        backup_curve = km_survival(
            backup.durations_s[backup_sel], backup.censored[backup_sel], backup.weights_of(backup_sel)
        )
    window_d, window_c, window_age = _latest_in_order(primary, mask, knobs.replay_max_calls)
    short_d, short_c, _ = primary.expanded(short_sample)
    backup_d, backup_c, _ = backup.expanded(backup_sel)
    return Observation(
        estimate=estimate,
        window_s=window,
        calls=calls,
        observed_hedge_rate=_rate(hedges, calls),
        backup_win_rate=_rate(wins, hedges),
        hedges=hedges,
        short_window_calls=short_calls,
        short_window_hedge_rate=_rate(counts.sum("hedged", short), short_calls),
        call_ttft_samples=ttft_n,
        call_p99_s=_weighted_quantile(data.call_ttft.durations_s[ttft_mask], data.call_ttft.weight[ttft_mask], 0.99)
        if ttft_n
        else None,
        short_window_target_s=short_target_s,
        wanted_hedge_rate=_rate(counts.sum("wanted", in_window), calls),
        short_window_wanted_rate=_rate(counts.sum("wanted", short), short_calls),
        primary_durations_s=tuple(window_d.tolist()),
        primary_censored=tuple(window_c.tolist()),
        primary_started_s=tuple((-window_age).tolist()),
        backup_durations_s=tuple(backup_d.tolist()),
        backup_censored=tuple(backup_c.tolist()),
        short_durations_s=tuple(short_d.tolist()),
        short_censored=tuple(short_c.tolist()),
        backup_curve=backup_curve,
        drift=drift,
    )
