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
same order, so the values are equal to the last bit (``tests/controller/test_km.py`` checks it);
scipy's versions take neither weights nor a table built once and cut many ways, and building
their objects cost 0.3-1 ms per call, about 20 times the arithmetic at 1,000 samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["DurationIndex", "RiskTable", "logrank_z", "risk_table"]

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
        reached = np.flatnonzero(sf <= 1.0 - q + _EPS)
        return float(self.times_s[reached[0]]) if reached.size else None

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
    """One sample sorted once, from which the :class:`RiskTable` of any subset is counted.

    The drift tests cut one window at many split points; sorting each part again costs a sort
    per part. Here the distinct durations are found once (``np.unique``) and each subset's
    weight and first tokens per distinct duration are two ``np.bincount`` calls. With whole
    number weights (counts) every sum is exact in float64, so :meth:`table` equals
    ``risk_table`` of the subset to the last bit (``tests/controller/test_km.py`` checks it).

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

    def table(self, mask: np.ndarray) -> RiskTable:
        """The risk table of the entries where ``mask`` (bool, shape (n,)) is True (at least one)."""
        index = self.index[mask]
        size = self.times_s.size
        weight_at = np.bincount(index, weights=self.weights[mask], minlength=size)
        events = np.bincount(index, weights=self.died[mask], minlength=size)
        present = weight_at > 0
        weight_at, events = weight_at[present], events[present]
        total = float(weight_at.sum())
        at_risk = total - (np.cumsum(weight_at) - weight_at)
        return RiskTable(self.times_s[present], at_risk, events, total)


def logrank_z(x: RiskTable, y: RiskTable) -> float:
    """The log-rank statistic of sample ``x`` against ``y`` (standard normal when both come
    from one distribution; positive when ``x`` has more first tokens than expected, i.e. is
    faster). NaN when no first token was seen at a time with more than one at risk.

    Args:
        x / y: the two samples' risk tables.
    """
    times = np.union1d(x.times_s[x.event_mask], y.times_s[y.event_mask])
    n_x, n_y = x.at_risk_at(times), y.at_risk_at(times)
    d_x = _events_at(x, times)
    d = d_x + _events_at(y, times)
    n = n_x + n_y
    num = n_x * n_y * d * (n - d)
    den = n**2 * (n - 1)
    keep = n > 1
    variance = float(np.sum(num[keep] / den[keep]))
    expected = float(np.sum(n_x * (d / n)))
    if variance <= 0:
        return math.nan
    return (float(x.events.sum()) - expected) / math.sqrt(variance)


def _events_at(table: RiskTable, times: np.ndarray) -> np.ndarray:
    """The table's first-token weight at each of ``times`` (0 where it has none)."""
    index = np.searchsorted(table.times_s, times)
    found = index < table.times_s.size
    found[found] = table.times_s[index[found]] == times[found]
    return np.where(found, table.events[np.minimum(index, table.times_s.size - 1)], 0.0)
