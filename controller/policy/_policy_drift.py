"""Detect a change of the primary's TTFT distribution inside the estimation window.

After a slowdown (or a recovery) the 1-hour window mixes two distributions and its estimate
lags the new one by up to an hour. Each tick therefore compares the most recent part of the
window with the rest, for a few candidate split points ``s`` (the last 2, 3, 5, 8, 12, 20, 30,
40, 50, 55 and 58 minutes): the log-rank test (Mantel 1966; ``_km.logrank_z``), which handles the
right-censored primaries of hedged calls like Kaplan-Meier does. The change point is the split
with the largest log-rank statistic among those that pass (a maximally selected log-rank
statistic, Lausen & Schumacher 1992), located more finely: the largest statistic on a 60 s grid
strictly between that split's neighbours (never under 2 minutes, ``MIN_SINCE_S``). The window
shrinks to the data since then.

A split passes when

* both parts hold at least ``min_samples`` primaries (the policy's ``min_samples``),
* its p-value times the number of splits tried is below ``alpha`` (Bonferroni over the
  splits; default ``alpha = 0.001``: with 60 ticks an hour a false alarm every ~17 hours at
  most), and
* the change is material: the KM medians of the two parts differ by at least
  ``min_ratio`` (default 1.75x either way). With thousands of samples the log-rank test also
  flags the small, harmless drifts of real traffic; shrinking the window for those only adds
  noise. A 2x slowdown of the route must be followed within 2 ticks, while the short-lived
  median moves of one slow replica's queue must not be.

**Tail recovery** (``detect_tail_recovery``). The median test cannot see a change confined to
the tail: after a queue on one replica of several, the window's medians barely move while its
P99 is the queue's, and the objective's predicted tail over that window stays the queue's for
the hour. So when no median change passes, the tails are compared, one-sidedly: for each split,
the older part's KM P99 (the policy's ``tail_quantile``) is the level, each part's primaries
known to have waited past it are counted, and the split passes when the one-sided Fisher exact
test (recent share lower) passes the same Bonferroni-corrected ``alpha`` and the older share is
at least ``min_ratio`` times the recent one; the smallest p-value wins, located on the 60 s
grid. Only a *lighter* recent tail cuts the window: a heavier one is a queue building up, and
the short window's over-budget test (rule 4) answers a queue. With 1% of the older part beyond
the level, 0 of ``n`` recent primaries pass at ``n`` of about 1,000 (Fisher p about
``0.99 ** n`` times 11 splits). Worked number
(``tests/controller/policy/test_policy_drift.py``): the window of the log-rank example without the
slowdown, but 10% of the calls of a 7-minute queue that ended 12 minutes ago 8x slower: no
median change; the tail test cuts at 720 s (level 4.37 s, 0 of 2,184 recent primaries past it
against 71 of 7,176 older ones, p = 5.9e-9).

The detection is stateless: a change 7 minutes ago is found again at the next tick by the
8-minute split, so the window grows back with the data since the change until it reaches the
configured window (then nothing older than the change is left to contrast; the splits reach to
58 minutes, 2 minutes of data short of a 1-hour window, so that the window sheds the last
minutes of an old regime too). Worked number
(``tests/controller/policy/test_policy_drift.py``): 3 calls/s, lognormal TTFT (median 0.6 s, sigma
0.5) for 50 minutes, then every TTFT doubled for 2 minutes: the 2-minute split is chosen
(log-rank statistic 22.3, a z-score; median ratio 2.14; 347 recent samples).

The benchmark runs behind the ratio, the splits, the 60 s grid and the one-sided tail test:
``docs/evaluation.md``, "Drift".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from hedgerow.controller.policy._km import DurationIndex, at_risk_of, km_quantiles, km_survival_rows, logrank_rows

__all__ = [
    "DEFAULT_SPLITS_S",
    "MIN_SINCE_S",
    "REFINE_STEP_S",
    "Change",
    "TailRecovery",
    "detect_change",
    "detect_tail_recovery",
]

#: Candidate lengths of the recent part, seconds.
DEFAULT_SPLITS_S: tuple[float, ...] = (
    120.0, 180.0, 300.0, 480.0, 720.0, 1200.0, 1800.0, 2400.0, 3000.0, 3300.0, 3480.0,
)  # fmt: skip
#: Step of the grid on which the change point is located once a split passed, seconds.
REFINE_STEP_S = 60.0
#: Shortest window since a change, seconds: fewer minutes of data make a noisy estimate.
MIN_SINCE_S = 120.0


@dataclass(frozen=True, slots=True)
class Change:
    """A detected change: the window to use and the evidence.

    Attributes:
        since_s: seconds before the window's end where the change was placed (the new window).
        statistic: the log-rank statistic of that split (standard normal under no change).
        p_value: its two-sided p-value (not yet multiplied by the number of splits).
        median_ratio: KM median of the recent part over that of the older part.
        recent_samples / older_samples: sizes of the two parts.
    """

    since_s: float
    statistic: float
    p_value: float
    median_ratio: float
    recent_samples: int
    older_samples: int


def detect_change(
    age_s: np.ndarray,
    durations_s: np.ndarray,
    censored: np.ndarray,
    *,
    window_s: float,
    min_samples: int,
    alpha: float = 1e-3,
    min_ratio: float = 1.75,
    splits_s: tuple[float, ...] = DEFAULT_SPLITS_S,
    refine_step_s: float = REFINE_STEP_S,
    weights: np.ndarray | None = None,
) -> Change | None:
    """The change point of the primary's TTFT distribution in a window, or None.

    Args:
        age_s: how long before the window's end each sample's call started, seconds, shape (n,).
        durations_s: primary durations, seconds, shape (n,).
        censored: True where the duration is a censoring time, shape (n,).
        window_s: the window's length, seconds; splits at or beyond it are not tried.
        min_samples: fewest samples in each part for a split to be tried.
        alpha: family-wise false-alarm level over the splits, in (0, 1).
        min_ratio: smallest material ratio of the two parts' KM medians, >= 1.
        splits_s: candidate lengths of the recent part, seconds, ascending.
        refine_step_s: grid step on which the change point is located between the chosen
            split's neighbours, seconds; 0 keeps the chosen split.
        weights: how many samples each entry stands for (whole numbers >= 1), shape (n,);
            None: 1 each (a histogram's entries are tested as the samples they count).

    Returns:
        None when no split passes. Else the ``Change`` at the largest statistic among the
        passing split and the points of the ``refine_step_s`` grid strictly between its
        neighbouring splits (0 and the window's end at the ends) and not shorter than
        ``MIN_SINCE_S``.

    Raises:
        ValueError: arrays of different shapes, ``alpha`` outside (0, 1) or ``min_ratio < 1``.
    """
    sample = _checked(age_s, durations_s, censored, alpha, min_ratio, weights)
    tried = [s for s in splits_s if s < window_s]
    best: Change | None = None
    for change in _changes(sample, tried, min_samples):
        if change is None or not change.p_value * len(tried) < alpha:
            continue
        if max(change.median_ratio, 1.0 / change.median_ratio) < min_ratio:
            continue
        if best is None or change.statistic > best.statistic:
            best = change
    if best is None or refine_step_s <= 0:
        return best
    # locate the change between the chosen split's neighbours on a finer grid: the split with the
    # largest statistic estimates the change point (Lausen & Schumacher 1992), and a coarse one
    # that lies minutes past the change mixes the old regime into the new window
    for change in _changes(sample, _refine_points(tried, best.since_s, window_s, refine_step_s), min_samples):
        if change is not None and change.statistic > best.statistic:
            best = change
    return best


@dataclass(frozen=True, slots=True)
class _Sample:
    """The samples both tests cut: their ages, shape (n,), and their durations, censoring flags
    and weights indexed once (each part's risk table is then counted, not sorted)."""

    age: np.ndarray
    grid: DurationIndex


@dataclass(frozen=True, slots=True)
class _Parts:
    """The two parts of a sample at each of several splits (rows), counted at the sample's
    distinct durations (columns, ``DurationIndex.times_s``); every count a whole number, exact.

    Attributes:
        weight / died: the recent part's weight and first-token weight, shape (p, m).
        older_weight / older_died: the older part's, shape (p, m).
        total_died: the whole sample's first-token weight, shape (m,).
    """

    weight: np.ndarray
    died: np.ndarray
    older_weight: np.ndarray
    older_died: np.ndarray
    total_died: np.ndarray

    @classmethod
    def of(cls, sample: _Sample, splits: list[float]) -> _Parts:
        """Count both parts at each split (recent: ``age < split``) in one pass over the sample."""
        order = np.argsort(np.asarray(splits, dtype=float), kind="stable")
        ascending = np.asarray(splits, dtype=float)[order]
        # an entry is recent at the i-th split (ascending) from i = the number of splits <= its age on
        group = np.searchsorted(ascending, sample.age, side="right")
        weight, died = sample.grid.cumulative(group, len(splits))
        total_weight, total_died = sample.grid.totals()
        back = np.argsort(order)  # the rows in the order of ``splits``
        weight, died = weight[back], died[back]
        return cls(weight, died, total_weight - weight, total_died - died, total_died)


def _checked(
    age_s: np.ndarray,
    durations_s: np.ndarray,
    censored: np.ndarray,
    alpha: float,
    min_ratio: float,
    weights: np.ndarray | None,
) -> _Sample:
    """The samples as arrays, with the knobs both tests share checked.

    Raises:
        ValueError: arrays of different shapes, ``alpha`` outside (0, 1) or ``min_ratio < 1``.
    """
    age = np.asarray(age_s, dtype=float)
    durations = np.asarray(durations_s, dtype=float)
    flags = np.asarray(censored, dtype=bool)
    w = np.ones(durations.shape) if weights is None else np.asarray(weights, dtype=float)
    if not (age.shape == durations.shape == flags.shape == w.shape):
        raise ValueError(
            f"age_s, durations_s, censored and weights differ in shape: {age.shape}, {durations.shape},"
            f" {flags.shape}, {w.shape}"
        )
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not (math.isfinite(min_ratio) and min_ratio >= 1):
        raise ValueError(f"min_ratio must be a finite number >= 1, got {min_ratio!r}")
    return _Sample(age, DurationIndex.of(durations, flags, w))


def _refine_points(tried: list[float], since_s: float, window_s: float, refine_step_s: float) -> list[float]:
    """The ``refine_step_s`` grid points strictly between the chosen split's neighbouring splits
    (0 and ``window_s`` at the ends), not under ``MIN_SINCE_S``, the chosen split left out."""
    index = tried.index(since_s)
    low = tried[index - 1] if index > 0 else 0.0
    high = tried[index + 1] if index + 1 < len(tried) else window_s
    grid = np.arange(refine_step_s, high, refine_step_s)
    return [float(split) for split in grid if not (split <= low or split < MIN_SINCE_S or split == since_s)]


def _changes(sample: _Sample, splits: list[float], min_samples: int) -> list[Change | None]:
    """The log-rank comparison of the samples younger than each split with the older ones.

    All splits at once (``_Parts``: each part's risk table counted at the sample's distinct
    durations, every first-token time of either part among them), each split's statistic
    summed over its own terms (``_km.logrank_rows``), so each equals ``_km.logrank_z`` of the
    two parts' own tables to the bit. A split's entry is None when either part has fewer than
    ``min_samples`` samples, is all censored, or has no KM median (or a median of 0).
    """
    if not splits:
        return []
    parts = _Parts.of(sample, splits)
    grid, total_died = sample.grid, parts.total_died
    events = total_died > 0  # the pooled sample's first-token times
    at_risk, older_at_risk = at_risk_of(parts.weight), at_risk_of(parts.older_weight)
    statistics = logrank_rows(
        at_risk[:, events],
        older_at_risk[:, events],
        parts.died[:, events],
        total_died[events],
        parts.died.sum(axis=1),
    )
    m_recent = km_quantiles(grid.times_s, km_survival_rows(at_risk, parts.died), 0.5)
    m_older = km_quantiles(grid.times_s, km_survival_rows(older_at_risk, parts.older_died), 0.5)
    n_recent, n_older = parts.weight.sum(axis=1), parts.older_weight.sum(axis=1)
    d_recent, d_older = parts.died.sum(axis=1), parts.older_died.sum(axis=1)
    out: list[Change | None] = []
    for i, split in enumerate(splits):
        recent_n, older_n = int(n_recent[i]), int(n_older[i])
        if recent_n < min_samples or older_n < min_samples or d_recent[i] == 0 or d_older[i] == 0:
            out.append(None)
            continue
        statistic = statistics[i]
        p_value = float(2.0 * special.ndtr(-abs(statistic)))
        median_recent, median_older = float(m_recent[i]), float(m_older[i])
        # a NaN median (none reached) fails ``> 0`` as a median of 0 does
        if not math.isfinite(p_value) or not (median_recent > 0 and median_older > 0):
            out.append(None)
            continue
        out.append(Change(float(split), abs(statistic), p_value, median_recent / median_older, recent_n, older_n))
    return out


@dataclass(frozen=True, slots=True)
class TailRecovery:
    """A recent part of the window whose tail is lighter than the older part's.

    Attributes:
        since_s: seconds before the window's end where the recent part starts (the new window).
        level_s: the older part's KM ``q`` quantile, seconds: the tail level compared.
        recent_over / recent_known: recent primaries known past ``level_s``, of those known.
        older_over / older_known: the same in the older part.
        p_value: one-sided Fisher exact p-value (recent share lower; not yet multiplied by the
            number of splits).
        recent_samples / older_samples: sizes of the two parts.
    """

    since_s: float
    level_s: float
    recent_over: int
    recent_known: int
    older_over: int
    older_known: int
    p_value: float
    recent_samples: int
    older_samples: int


def detect_tail_recovery(
    age_s: np.ndarray,
    durations_s: np.ndarray,
    censored: np.ndarray,
    *,
    window_s: float,
    min_samples: int,
    alpha: float = 1e-3,
    min_ratio: float = 1.75,
    q: float = 0.99,
    splits_s: tuple[float, ...] = DEFAULT_SPLITS_S,
    refine_step_s: float = REFINE_STEP_S,
    weights: np.ndarray | None = None,
) -> TailRecovery | None:
    """The start of a recent part whose tail is lighter than the older part's, or None.

    One-sided: only a *lighter* recent tail passes (see the module docstring for why). For each
    split, ``level_s`` is the older part's KM ``q`` quantile and each part's primaries known to
    have had no first token by then are counted (``_exceedances``). A split passes when both
    parts hold ``min_samples``, the older share is at least ``min_ratio`` times the recent one,
    and the one-sided Fisher exact test (``scipy.stats.fisher_exact``, recent share lower) has
    a p-value times the number of splits tried below ``alpha``. The passing split with the
    smallest p-value is kept, then located on the ``refine_step_s`` grid between its
    neighbouring splits like ``detect_change`` (never under ``MIN_SINCE_S``).

    Args:
        age_s / durations_s / censored: as ``detect_change``, shape (n,) each.
        window_s: the window's length, seconds; splits at or beyond it are not tried.
        min_samples: fewest samples in each part for a split to be tried.
        alpha: family-wise false-alarm level over the splits, in (0, 1).
        min_ratio: smallest material ratio of the older share over the recent one, >= 1.
        q: the tail level in (0, 1) (the policy's ``tail_quantile``).
        splits_s: candidate lengths of the recent part, seconds, ascending.
        refine_step_s: grid step of the location, seconds; 0 keeps the chosen split.
        weights: as ``detect_change``.

    Returns:
        The ``TailRecovery`` with the smallest p-value, or None when no split passes.

    Raises:
        ValueError: arrays of different shapes, ``alpha`` outside (0, 1), ``min_ratio < 1`` or
            ``q`` outside (0, 1).
    """
    sample = _checked(age_s, durations_s, censored, alpha, min_ratio, weights)
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    tried = [s for s in splits_s if s < window_s]
    best: TailRecovery | None = None
    for found in _tail_splits(sample, tried, min_samples, q, min_ratio):
        if found is None or not found.p_value * len(tried) < alpha:
            continue
        if best is None or found.p_value < best.p_value:
            best = found
    if best is None or refine_step_s <= 0:
        return best
    for found in _tail_splits(
        sample, _refine_points(tried, best.since_s, window_s, refine_step_s), min_samples, q, min_ratio
    ):
        if found is not None and found.p_value < best.p_value:
            best = found
    return best


def _tail_splits(
    sample: _Sample, splits: list[float], min_samples: int, q: float, min_ratio: float
) -> list[TailRecovery | None]:
    """The one-sided tail comparison of ``detect_tail_recovery`` at each split (``_Parts``).

    Each part's primaries known past the older part's ``q`` quantile are counted by
    ``_policy_rules.known_over``'s rule, weighted: a first token after the level, or a
    censoring time at or after it, is over; a censoring time before it is unknown. A split's
    entry is None when the comparison cannot be made (a part under ``min_samples``, no older
    ``q`` quantile, no older exceedance) or the older share is not ``min_ratio`` times the
    recent one.
    """
    if not splits:
        return []
    parts = _Parts.of(sample, splits)
    times = sample.grid.times_s
    levels = km_quantiles(times, km_survival_rows(at_risk_of(parts.older_weight), parts.older_died), q)
    out: list[TailRecovery | None] = []
    for i, split in enumerate(splits):
        n_recent, n_older = int(parts.weight[i].sum()), int(parts.older_weight[i].sum())
        level = float(levels[i])
        if n_recent < min_samples or n_older < min_samples or parts.older_died[i].sum() == 0 or math.isnan(level):
            out.append(None)
            continue
        at = int(np.searchsorted(times, level))  # the level is one of the distinct durations
        r_over, r_known = _exceedances(parts.weight[i], parts.died[i], at)
        o_over, o_known = _exceedances(parts.older_weight[i], parts.older_died[i], at)
        if r_known == 0 or o_over == 0 or o_over / o_known < min_ratio * r_over / r_known:
            out.append(None)
            continue
        table = [[r_over, r_known - r_over], [o_over, o_known - o_over]]
        p_value = float(stats.fisher_exact(table, alternative="less").pvalue)
        out.append(TailRecovery(float(split), level, r_over, r_known, o_over, o_known, p_value, n_recent, n_older))
    return out


def _exceedances(weight: np.ndarray, died: np.ndarray, at: int) -> tuple[int, int]:
    """``(over, known)`` of one part counted at the distinct durations (``weight`` and ``died``,
    shape (m,)) at the level ``times_s[at]``: first tokens after it or censoring times at or
    after it are over, censoring times before it unknown (``_policy_rules.known_over``)."""
    cut = weight - died
    over = float(died[at + 1 :].sum()) + float(cut[at:].sum())
    return int(over), int(weight.sum() - cut[:at].sum())
