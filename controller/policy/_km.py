"""Kaplan-Meier risk tables of weighted right-censored durations, and the log-rank test (pure numpy).

Every estimate of the controller (``estimation``, ``hedge_model.km_survival``, the drift tests of
``_policy_drift``) is built on one :class:`RiskTable`: the distinct durations ``t_1 < ... < t_m``
(first-token and censoring times alike), the weight at risk ``n_i`` (durations ``>= t_i``) and
the weight of first tokens ``d_i`` at each. Weights are frequencies: a sample of weight 3 is three
samples of the same duration, so a histogram (bucket, count) is a valid input and gives the
estimate of its expanded samples at the cost of its distinct buckets, not of its calls.

Formulas, with ``S`` the survival ``P(T > t)``:

- product-limit (Kaplan & Meier 1958): ``S(t_j) = prod_{i <= j} (1 - d_i / n_i)``;
- Greenwood's sum ``V_j = sum_{i <= j} d_i / (n_i (n_i - d_i))``, and the log-log interval
  (Kalbfleisch & Prentice 1980) ``S ** exp(+-z * sqrt(V) / |log S|)``, ``z`` the normal quantile
  of ``(1 + level) / 2``;
- log-rank (Mantel 1966): over the distinct first-token times of the pooled sample,
  ``U = sum (d_x - n_x d / n)`` and ``Var = sum n_x n_y d (n - d) / (n^2 (n - 1))`` (terms with
  ``n > 1``); the statistic ``U / sqrt(Var)`` is standard normal under equal distributions.

With unit weights the operations are those of ``scipy.stats.ecdf`` on ``scipy.stats.CensoredData``,
its ``confidence_interval(method="log-log")`` and ``scipy.stats.logrank`` (scipy 1.17), in the
same order, so the values are equal to the last bit (``tests/controller/policy/test_km.py`` checks it);
scipy's versions take neither weights nor a table built once and cut many ways, and building
their objects cost 0.3-1 ms per call, about 20 times the arithmetic at 1,000 samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = [
    "DurationIndex",
    "RiskTable",
    "at_risk_of",
    "km_quantiles",
    "km_survival_rows",
    "logrank_rows",
    "logrank_z",
    "risk_table",
]

# Absolute slack when comparing a KM probability with a level (a running product).
_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class RiskTable:
    """The Kaplan-Meier risk table of one sample.

    Attributes:
        times_s: distinct durations, seconds, ascending, shape (m,).
        at_risk: weight of the durations ``>= times_s[i]``, shape (m,).
        events: weight of the first tokens (uncensored durations) at ``times_s[i]``, shape (m,).
        total: the sample's total weight (its size with unit weights).
    """

    times_s: np.ndarray
    at_risk: np.ndarray
    events: np.ndarray
    total: float

    @property
    def event_mask(self) -> np.ndarray:
        """True where a first token was seen at that time (``S`` steps there), shape (m,)."""
        return self.events > 0

    def survival(self) -> np.ndarray:
        """``S`` from each time on (product-limit), shape (m,)."""
        return np.cumprod((self.at_risk - self.events) / self.at_risk)

    def loglog_bounds(self, level: float, survival: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The two-sided ``level`` log-log interval on ``S`` at each time: ``(low, high)``.

        NaN where it is undefined (``S`` = 0 or 1, or ``n_i = d_i`` earlier); the callers fill
        it (``estimation``).

        Args:
            level: the interval's two-sided confidence, in (0, 1).
            survival: ``self.survival()`` when already computed.
        """
        sf = self.survival() if survival is None else survival
        n, d = self.at_risk, self.events
        with np.errstate(divide="ignore", invalid="ignore"):
            var = 1 / np.log(sf) ** 2 * np.cumsum(d / (n * (n - d)))
            z_se = special.ndtri(1 / 2 + level / 2) * np.sqrt(var)
            points = np.log(-np.log(sf))
            low = np.exp(-np.exp(points + z_se))
            high = np.exp(-np.exp(points - z_se))
        return low, high

    def quantile_s(self, q: float, survival: np.ndarray | None = None) -> float | None:
        """The smallest time with ``S <= 1 - q`` (a first-token time), or None when ``S`` never
        gets there (censored samples left the risk set before)."""
        sf = self.survival() if survival is None else survival
        first = km_quantiles(self.times_s, sf, q)
        return None if math.isnan(first) else float(first)

    def at_risk_at(self, t_s: np.ndarray) -> np.ndarray:
        """Weight of the durations ``>= t_s`` (seconds, any shape)."""
        index = np.searchsorted(self.times_s, np.asarray(t_s, dtype=float), side="left")
        return np.append(self.at_risk, 0.0)[index]


def risk_table(durations_s: np.ndarray, censored: np.ndarray, weights: np.ndarray | None = None) -> RiskTable:
    """The :class:`RiskTable` of right-censored durations (validated by the caller).

    Args:
        durations_s: seconds, finite and >= 0, shape (n,), n >= 1.
        censored: True where the duration is a censoring time, shape (n,).
        weights: frequency of each duration (> 0), shape (n,); None: 1 each.

    Returns:
        The table over the distinct durations.
    """
    durations = np.asarray(durations_s, dtype=float)
    flags = np.asarray(censored, dtype=bool)
    w = np.ones(durations.size) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(durations, kind="stable")
    t = durations[order]
    w = w[order]
    died = np.where(flags[order], 0.0, w)
    starts = np.flatnonzero(np.diff(t, prepend=-np.inf) > 0)
    weight_at = np.add.reduceat(w, starts)
    events = np.add.reduceat(died, starts)
    total = float(w.sum())
    at_risk = total - (np.cumsum(weight_at) - weight_at)
    return RiskTable(t[starts], at_risk, events, total)


@dataclass(frozen=True, slots=True)
class DurationIndex:
    """One sample sorted once, from which the risk tables of its parts are counted.

    The drift tests cut one window at many split points; sorting each part again costs a sort
    per part, and building each part's table and log-rank test apart costs ~20 numpy calls per
    split. Here the distinct durations are found once (``np.unique``) and the weight and first
    tokens per distinct duration of every nested part are one ``np.bincount`` each
    (:meth:`cumulative`); ``at_risk_of``, ``km_survival_rows``, ``km_quantiles`` and
    ``logrank_rows`` then work on all parts at once. With whole number weights (counts) every
    sum is exact in float64, so each part gives ``risk_table`` of that part, its survival,
    quantiles and ``logrank_z`` to the last bit (``tests/controller/policy/test_km.py`` checks it).

    Attributes:
        times_s: the sample's distinct durations, seconds, ascending, shape (m,).
        index: each entry's position in ``times_s``, shape (n,).
        weights: each entry's weight, shape (n,).
        died: each entry's weight where it is a first token, else 0, shape (n,).
    """

    times_s: np.ndarray
    index: np.ndarray
    weights: np.ndarray
    died: np.ndarray

    @classmethod
    def of(cls, durations_s: np.ndarray, censored: np.ndarray, weights: np.ndarray) -> DurationIndex:
        """Index a sample (validated by the caller): durations in seconds, finite and >= 0,
        censoring flags and whole-number weights > 0, shape (n,) each."""
        times, index = np.unique(np.asarray(durations_s, dtype=float), return_inverse=True)
        w = np.asarray(weights, dtype=float)
        return cls(times, index.reshape(-1), w, np.where(np.asarray(censored, dtype=bool), 0.0, w))

    def cumulative(self, group: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """The weight and the first-token weight at each distinct duration of the entries whose
        ``group`` is ``<= i``, for each ``i`` in ``range(groups)``: shape (groups, m) each.

        One ``np.bincount`` over (group, duration) cells and a cumulative sum over the groups,
        so the parts of a sample at many nested cuts (the drift tests' recent parts, youngest
        first) cost one pass over the entries. With whole-number weights every sum is exact
        in float64, so each row equals the counts of its subset whatever the order of the sums.

        Args:
            group: each entry's group, integers >= 0, shape (n,); entries of group ``>= groups``
                are in no row.
            groups: the number of rows.
        """
        size = self.times_s.size
        cells = np.minimum(group, groups) * size + self.index
        shape = (groups + 1, size)
        weight = np.bincount(cells, weights=self.weights, minlength=shape[0] * size).reshape(shape)
        died = np.bincount(cells, weights=self.died, minlength=shape[0] * size).reshape(shape)
        return np.cumsum(weight[:groups], axis=0), np.cumsum(died[:groups], axis=0)

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole sample's weight and first-token weight at each distinct duration, shape (m,)."""
        size = self.times_s.size
        return (
            np.bincount(self.index, weights=self.weights, minlength=size),
            np.bincount(self.index, weights=self.died, minlength=size),
        )


def at_risk_of(weight: np.ndarray) -> np.ndarray:
    """The weight at risk (durations ``>=`` each time) from the weight at each distinct time,
    shape of ``weight`` (its last axis the times, ascending). Whole-number weights: exact, so
    equal to ``RiskTable.at_risk`` at its times."""
    return np.cumsum(weight[..., ::-1], axis=-1)[..., ::-1]


def km_quantiles(times_s: np.ndarray, survival: np.ndarray, q: float) -> np.ndarray:
    """The smallest time with ``S <= 1 - q`` (``RiskTable.quantile_s``) along the last axis.

    Args:
        times_s: the times, ascending, shape (m,).
        survival: ``S`` at each time, shape (..., m); NaN (a part with nobody left at risk)
            never reaches the level.
        q: the quantile level in (0, 1).

    Returns:
        Shape (...,): the time, NaN where ``S`` never gets to ``1 - q``.
    """
    reached = survival <= 1.0 - q + _EPS
    if not times_s.size:
        return np.full(survival.shape[:-1], np.nan)
    found: np.ndarray = np.where(reached.any(axis=-1), times_s[reached.argmax(axis=-1)], np.nan)
    return found


def km_survival_rows(at_risk: np.ndarray, events: np.ndarray) -> np.ndarray:
    """The product-limit ``S`` along the last axis (``RiskTable.survival``), shape of ``at_risk``.

    A time where a row has nobody (``events`` 0, ``at_risk`` > 0) multiplies by exactly 1.0,
    so each row equals the survival of its own table at its own times, to the bit; from the
    row's last time on (``at_risk`` 0) it is NaN.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        survival: np.ndarray = np.cumprod((at_risk - events) / at_risk, axis=-1)
    return survival


def logrank_z(x: RiskTable, y: RiskTable) -> float:
    """The log-rank statistic of sample ``x`` against ``y`` (standard normal when both come
    from one distribution; positive when ``x`` has more first tokens than expected, i.e. is
    faster). NaN when no first token was seen at a time with more than one at risk.

    Args:
        x / y: the two samples' risk tables.
    """
    times = np.union1d(x.times_s[x.event_mask], y.times_s[y.event_mask])
    d_x = _events_at(x, times)
    statistic: float = logrank_rows(
        x.at_risk_at(times), y.at_risk_at(times), d_x, d_x + _events_at(y, times), np.array([x.events.sum()])
    )[0]
    return statistic


def logrank_rows(n_x: np.ndarray, n_y: np.ndarray, d_x: np.ndarray, d: np.ndarray, x_events: np.ndarray) -> list[float]:
    """:func:`logrank_z` of several pairs of samples, one a row, over given first-token times.

    Args:
        n_x / n_y: weight at risk in either sample at each first-token time of the pooled
            sample, shape (p, e) (or (e,) for one pair).
        d_x / d: first-token weight of ``x`` and of both at those times, shape (p, e) or (e,).
        x_events: ``x``'s total first-token weight per row, shape (p,).

    Returns:
        One statistic per row (NaN where the variance is 0).
    """
    n = n_x + n_y
    num = n_x * n_y * d * (n - d)
    den = n**2 * (n - 1)
    keep = np.broadcast_to(n > 1, num.shape).reshape(x_events.size, num.shape[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (num / den).reshape(keep.shape)  # summed over ``keep`` only, like the 1-pair sum
    expected = np.reshape(n_x * (d / n), keep.shape)
    out = []
    for ratio_row, keep_row, expected_row, events in zip(ratio, keep, expected, x_events.tolist(), strict=True):
        variance = float(np.sum(ratio_row[keep_row]))
        mean = float(np.sum(expected_row))
        out.append(math.nan if variance <= 0 else (float(events) - mean) / math.sqrt(variance))
    return out


def _events_at(table: RiskTable, times: np.ndarray) -> np.ndarray:
    """The table's first-token weight at each of ``times`` (0 where it has none)."""
    index = np.searchsorted(table.times_s, times)
    found = index < table.times_s.size
    found[found] = table.times_s[index[found]] == times[found]
    return np.where(found, table.events[np.minimum(index, table.times_s.size - 1)], 0.0)
