"""The distribution-free evidence the rules read off raw primary samples: the known-over counts,
one-sided Clopper-Pearson bounds, the values the samples support or accept, the cold period's
level per look and the order-statistic band of a quantile. Pure numpy/scipy; behind the facade
:mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

__all__ = [
    "binomial_lower_bound",
    "binomial_upper_bound",
    "cold_start_confidence",
    "known_over",
    "known_over_counts",
    "least_accepted_value",
    "lowest_supported_value",
    "quantile_level_band",
    "supported_value",
]


def known_over(durations_s: np.ndarray, censored: np.ndarray, value_s: float) -> tuple[int, int]:
    """How many primaries are known to have had no first token by ``value_s``, of how many known.

    An observed TTFT is known either way (over when ``> value_s``); a censored one is known over
    when its censoring time is ``>= value_s`` (still waiting then) and unknown when it was
    censored earlier. So a hedge fired at a threshold ``h >= value_s`` always counts (its
    primary was still waiting at ``h``), one fired below ``value_s`` only when its primary was
    seen still waiting at ``value_s``, and hedges whose primaries were cancelled before
    ``value_s`` are left out of both counts. Leaving them out is conservative for showing the
    budget exceeded: a primary censored at ``c < value_s`` outlasts ``value_s`` with
    probability ``S(value_s) / S(c) >= S(value_s)``, so the known ones are the faster ones.

    Returns:
        ``(over, known)``.
    """
    over, known = known_over_counts(durations_s, censored, np.array([value_s], dtype=float))
    return int(over[0]), int(known[0])


def known_over_counts(
    durations_s: np.ndarray, censored: np.ndarray, values_s: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`known_over` at every value of ``values_s`` at once (one sort).

    Args:
        durations_s / censored: the samples, shape (n,).
        values_s: the values, seconds, shape (k,).
        weights: how many primaries each sample stands for, shape (n,); None: 1 each.

    Returns:
        ``(over, known)``, shape (k,) each (float with weights, int without).
    """
    durations = np.asarray(durations_s, dtype=float)
    flags = np.asarray(censored, dtype=bool)
    w = np.ones(durations.size) if weights is None else np.asarray(weights, dtype=float)
    values = np.asarray(values_s, dtype=float)
    order = np.argsort(durations, kind="stable")
    sorted_d, sorted_c, sorted_w = durations[order], flags[order], w[order]
    observed_d, observed_w = sorted_d[~sorted_c], np.concatenate(([0.0], np.cumsum(sorted_w[~sorted_c])))
    cut_d, cut_w = sorted_d[sorted_c], np.concatenate(([0.0], np.cumsum(sorted_w[sorted_c])))
    # over: observed TTFTs past v, or censored at or after v; unknown: censored before v
    cut_before = cut_w[np.searchsorted(cut_d, values, side="left")]
    over = (observed_w[-1] - observed_w[np.searchsorted(observed_d, values, side="right")]) + (cut_w[-1] - cut_before)
    known = w.sum() - cut_before
    if weights is None:
        return over.astype(np.int64), known.astype(np.int64)
    return over, known


@functools.lru_cache(maxsize=8192)  # pure in its scalars; the tick asks again per route
def binomial_lower_bound(successes: int, trials: int, confidence: float) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion.

    ``Beta(1 - confidence; x, n - x + 1)`` (Clopper & Pearson, Biometrika 26, 1934); 0 when
    ``x = 0``. Worked number: 5 of 20 at 95% gives 0.104, so a 10% budget is shown exceeded;
    3 of 20 gives 0.042, so it is not.
    """
    return float(_lower_bounds(np.asarray(successes), np.asarray(trials), confidence))


@functools.lru_cache(maxsize=8192)  # pure in its scalars; the tick asks again per route
def binomial_upper_bound(successes: int, trials: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial proportion.

    ``Beta(confidence; x + 1, n - x)`` (Clopper & Pearson, Biometrika 26, 1934); 1 when
    ``x >= n``. With ``x = 0`` it is ``1 - (1 - confidence) ** (1 / n)``, so a 10% budget can be
    shown met at 95% only from ``n = 29`` samples on (``ln 0.05 / ln 0.9 = 28.4``): 0 of 29 gives
    0.098, 0 of 28 gives 0.101.
    """
    return float(_upper_bounds(np.asarray(successes), np.asarray(trials), confidence))


def _lower_bounds(successes: np.ndarray, trials: np.ndarray, confidence: float) -> np.ndarray:
    """:func:`binomial_lower_bound` element-wise (any matching shapes)."""
    x, n = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    shown = (x > 0) & (n > 0)
    bound = stats.beta.ppf(1.0 - confidence, np.where(shown, x, 1.0), np.where(shown, n - x + 1, 1.0))
    return np.where(shown, bound, 0.0)


def _upper_bounds(successes: np.ndarray, trials: np.ndarray, confidence: float) -> np.ndarray:
    """:func:`binomial_upper_bound` element-wise (any matching shapes)."""
    x, n = np.maximum(np.asarray(successes, dtype=float), 0.0), np.asarray(trials, dtype=float)
    full = (n <= 0) | (x >= n)
    bound = stats.beta.ppf(confidence, x + 1, np.where(full, 1.0, n - x))
    return np.where(full, 1.0, bound)


def supported_value(
    durations_s: np.ndarray,
    censored: np.ndarray,
    budget: float,
    confidence: float,
    start_s: float,
    fallback_s: float,
) -> tuple[float, float]:
    """Where the samples put a value that they show over budget.

    The test: the one-sided ``confidence`` Clopper-Pearson lower bound on ``over / known`` of
    ``known_over(start_s)`` above ``budget`` shows ``start_s`` over budget. Then the value goes
    to :func:`lowest_supported_value` above ``start_s``: the smallest value that the samples
    show *within* the budget with the same confidence, or ``fallback_s`` (the route's maximum)
    when none qualifies. Worked number: 20 calls of which 5 waited past 2.0 s (lower bound
    0.104) go to the maximum; 300 of which 60 waited past 5.0 s and none past 6.0 s go to
    6.0 s (upper bound 0.0099).

    Returns:
        ``(value_s, lower_bound_at_start)``; ``value_s`` is ``start_s`` when the test does not
        show it over budget.
    """
    over, known = known_over(durations_s, censored, start_s)
    at_start = binomial_lower_bound(over, known, confidence)
    if at_start <= budget:
        return float(start_s), at_start
    value = lowest_supported_value(durations_s, censored, budget, confidence, above_s=start_s, fallback_s=fallback_s)
    return max(value, float(start_s)), at_start


def lowest_supported_value(
    durations_s: np.ndarray,
    censored: np.ndarray,
    budget: float,
    confidence: float,
    *,
    above_s: float,
    fallback_s: float,
) -> float:
    """The smallest value above ``above_s`` that the samples show within the budget, seconds.

    The candidates are the sample durations above ``above_s`` and a point just above the
    largest. A candidate ``v`` is shown within the budget when the one-sided ``confidence``
    Clopper-Pearson upper bound on ``(over + unknown) / n`` at ``v`` (``known_over``; the
    primaries censored before ``v`` counted as still waiting there) is ``<= budget``: the
    objective's own constraint (the hedge rate's ~95% upper bound within the budget), read with
    the distribution-free binomial bound instead of the Kaplan-Meier curve, which has too few
    samples here. ``over + unknown`` only falls as ``v`` grows, so the first candidate that
    qualifies is the smallest. With ``n`` samples all observed, ``v`` at the ``(k+1)``-th
    slowest sample leaves ``k`` over, so the value comes down as ``n`` grows: at a 10% budget
    and 95%, ``k = 0`` needs ``n >= 29`` (``1 - 0.05 ** (1 / n)``: 0.098 at 29, 0.101 at 28;
    see :func:`binomial_upper_bound`), ``k = 1`` needs 46, ``k = 2`` 61. When no candidate
    qualifies (too few samples, too many slow ones, or primaries censored near the top) the
    value is ``fallback_s``.

    Args:
        durations_s / censored: the primary samples, seconds and True = censored, shape (n,).
        budget: the route's budget, in (0, 1).
        confidence: the bound's one-sided level, in (0, 1).
        above_s: only candidates above this, seconds (0 for the whole range).
        fallback_s: the value when none qualifies, seconds.

    Returns:
        The value, seconds.
    """
    durations = np.asarray(durations_s, dtype=float)
    n = int(durations.size)
    if n == 0:
        return float(fallback_s)
    candidates = np.append(np.unique(durations[durations > above_s]), np.nextafter(durations.max(), math.inf))
    over, known = known_over_counts(durations, censored, candidates)
    waiting = over + (n - known)  # known over, or censored before the candidate: possibly waiting
    upper = _upper_bounds(waiting, np.full(waiting.shape, n), confidence)
    accepted = np.flatnonzero(upper <= budget)
    return float(candidates[accepted[0]]) if accepted.size else float(fallback_s)


@functools.lru_cache(maxsize=256)  # pure in its scalars; the tick asks again per route
def cold_start_confidence(confidence: float, budget: float, min_samples: int) -> float:
    """The level of each look of a cold route's :func:`lowest_supported_value`, in (0, 1).

    A cold route looks again every tick as its samples grow, and each look at a new order
    statistic is one more chance to publish a value over budget. With the samples observed,
    the value supported with ``k`` of them past it is their ``(k+1)``-th slowest, first allowed
    at ``n_k`` samples (the least ``n`` with ``P(Binomial(n, budget) <= k) <= 1 - confidence``,
    the Clopper-Pearson upper bound of ``k`` of ``n`` within the budget). That value lies below
    the true ``1 - budget`` quantile at some ``n >= n_k`` only if at most ``k`` samples lie
    beyond that quantile at ``n``, hence also among the first ``n_k``: so each look errs with
    probability ``<= 1 - confidence`` over the whole cold period, and the ``L`` looks taken
    before the objective takes over (``n_k <= min_samples``) err with at most
    ``L * (1 - confidence)`` together. Bonferroni's split (the union bound) gives each look
    ``1 - (1 - confidence) / L``, so the cold period as a whole holds ``confidence``.
    Worked numbers (10% budget, 95%, ``min_samples`` 50): ``n_0 = 29`` and ``n_1 = 46`` (the
    second slowest of 46 lies below the true P90 with probability ``P(Binomial(46, 0.1) <= 1)
    = 0.048``), ``n_2 = 61``: ``L = 2``, each look at 97.5%, where ``k = 0`` needs 36 samples
    (0 of 35 gives 0.1000, 0 of 36 0.0974) and ``k = 1`` 54, after the objective's 50.

    Args:
        confidence: the cold period's one-sided level, in (0, 1).
        budget: the route's budget, in (0, 1).
        min_samples: the sample count from which the objective decides.

    Returns:
        ``1 - (1 - confidence) / max(L, 1)``.
    """
    looks, n = 0, 1
    while n <= min_samples:
        if stats.binom.cdf(looks, n, budget) <= 1.0 - confidence:
            looks += 1  # look ``k = looks - 1`` is first allowed at this n
        else:
            n += 1
    return 1.0 - (1.0 - confidence) / max(looks, 1)


def least_accepted_value(
    durations_s: np.ndarray, censored: np.ndarray, budget: float, confidence: float, start_s: float
) -> float:
    """The smallest value above ``start_s`` that the over-budget test no longer condemns, seconds.

    The candidates are the sample durations above ``start_s`` and a point just above the largest
    (where no primary is known over, so the test always accepts it). A candidate ``v`` is
    accepted when the one-sided ``confidence`` Clopper-Pearson lower bound on ``over / known``
    of ``known_over(v)`` is ``<= budget``: the test that rule 4 applies to any proposal, so a
    value it accepts from the objective is one it accepts from itself. Cost: one sort and one
    vectorized beta quantile over the candidates. Worked number: 300 primaries of which 60
    waited 6.0 s and 240 took 0.4 s, from 5.0 s: 6.0 s (none is past it); 1,000 primaries
    spread evenly over 0.001-1.0 s, from 0.5 s: 0.884 s (116 of 1,000 past it, lower bound
    0.0997), where the upper bound of ``supported_value`` goes to 0.916 s (84 past it).

    Returns:
        The accepted value, seconds (``> start_s``).
    """
    durations = np.asarray(durations_s, dtype=float)
    above = np.unique(durations[durations > start_s])
    candidates = np.append(above, np.nextafter(durations.max(initial=start_s), math.inf))
    over, known = known_over_counts(durations, censored, candidates)
    lower = _lower_bounds(over, known, confidence)
    accepted = np.flatnonzero(lower <= budget)
    return float(candidates[accepted[0]]) if accepted.size else float(candidates[-1])


@functools.lru_cache(maxsize=8192)  # pure in its scalars; the tick asks again per route
def quantile_level_band(n: int, q: float, confidence: float) -> tuple[float, ...]:
    """The levels between which the sample quantile of the true ``q`` one lies, and ``q``.

    Distribution-free order-statistic bounds (Hahn & Meeker, "Statistical Intervals", 1991,
    sec. 5.2): the count ``K ~ Binomial(n, 1 - q)`` of samples beyond the true ``q`` quantile
    is at most its ``confidence`` quantile ``k_hi`` and at least its ``1 - confidence``
    quantile ``k_lo`` (each one-sided with probability ``>= confidence``), so the true quantile
    lies between the sample quantiles at levels ``(n - k_hi) / n`` and ``(n - k_lo) / n``.
    Returns ``(low, q, high)``, the ends clipped to ``(0, 1)`` (a bound that does not exist,
    ``n - k_hi <= 0`` or ``k_lo = 0``, is replaced by ``q``'s neighbourhood end
    ``1 / (2n)`` and ``1 - 1 / (2n)``). Worked numbers (``q = 0.99``, 95%): 160 samples give
    ``(0.975, 0.99, 1 - 1/320)`` (``k_hi = 4`` of an expected 1.6, ``k_lo = 0``); 10,000 give
    ``(0.9883, 0.99, 0.9916)`` (``k_hi = 117``, ``k_lo = 84``).
    """
    if n <= 0:
        return (q,)
    k_hi = int(stats.binom.ppf(confidence, n, 1.0 - q))
    k_lo = int(stats.binom.ppf(1.0 - confidence, n, 1.0 - q))
    low = (n - k_hi) / n if n - k_hi > 0 else 1.0 / (2 * n)
    high = (n - k_lo) / n if k_lo > 0 else 1.0 - 1.0 / (2 * n)
    return (min(low, q), q, max(high, q))
