"""Estimate the primary's TTFT distribution from right-censored samples (Kaplan-Meier).

Why censoring matters
---------------------
Hedging censors exactly the samples the controller cares about. A primary with no first token by
``hedge_after_s`` gets a backup; when the backup's first token comes first, the primary is
cancelled at time ``c`` and all we know is ``TTFT > c``. If those cancelled primaries are dropped
and quantiles are taken over the uncensored TTFTs only, the slowest primaries are missing, every
quantile comes out too low, the controller lowers ``hedge_after_s``, more primaries get hedged and
censored, the quantiles drop further: the threshold ratchets down and the hedge rate up, past the
budget. The Kaplan-Meier estimator uses each censored primary for as long as it is known to be
still waiting (it stays in the risk set up to ``c``), so it stays unbiased under this censoring,
which is independent of the primary's own TTFT once the primary is slower than the threshold.

Method
------
Let ``t_1 < t_2 < ... < t_k`` be the distinct observed first-token times (uncensored samples),
``d_i`` the number of first tokens at ``t_i`` and ``n_i`` the number of primaries still at risk
just before ``t_i`` (TTFT or censoring time ``>= t_i``). The product-limit estimate of the
survival function ``S(t) = P(TTFT > t)`` is

    S(t) = prod_{t_i <= t} (1 - d_i / n_i),        F(t) = 1 - S(t)            (Kaplan & Meier)

with Greenwood's variance ``Var[S(t)] ~= S(t)^2 * sum_{t_i <= t} d_i / (n_i (n_i - d_i))``.

The pointwise confidence interval is scipy's ``method="log-log"`` (Kalbfleisch & Prentice): with
``sigma^2 = sum d_i / (n_i (n_i - d_i)) / log(S(t))^2`` and ``z`` the normal quantile of
``(1 + confidence) / 2``, the bounds are ``lower = S(t) ** exp(+z * sigma)`` and
``upper = S(t) ** exp(-z * sigma)`` (the normal interval of ``log(-log S(t))``, transformed
back; scipy 1.17 ``EmpiricalDistributionFunction._loglog_ci``). We chose it over the
default ``"linear"`` (``S(t) +/- z * sqrt(Var)``, clipped to [0, 1]) because we read the upper
bound far in the tail (near S = 0.10) and then take the *first* time that bound drops under the
budget, which favours a bound that happens to dip low. In a simulation (lognormal TTFT, no
censoring, 300 repetitions per size, seed 1) the share of targets whose true exceedance
probability was above a 0.10 budget was, for n = 60 / 200 / 1000: linear 6.7% / 5.3% / 5.3%,
log-log 1.7% / 2.7% / 2.7%. Only log-log held the nominal one-sided 2.5% of a two-sided 95%
interval; the price is a target about 15% (n = 60) to 1% (n = 1000) higher. Both
formulas are undefined where S(t) = 0 (at the last sample, when it is uncensored: every
primary still at risk had its first token), and scipy then returns NaN. There we use the exact
binomial (Clopper-Pearson) bound of that last step, ``1 - (alpha/2)^(1/n_i)``, times the bound
just before it, so that data with many tied TTFTs (a cache, a fixed-latency upstream) still
gets a target instead of none. Any other NaN bound counts as "not known to be under the budget".

Outputs
-------
* Quantile ``q``: the smallest observed first-token time ``t`` with ``F(t) >= q``. When the KM
  curve never reaches ``q`` (the censored primaries left the risk set before it got there) the
  quantile is ``None``: we never extrapolate. ``quantile_lower_bound_s`` then gives a real
  one-sided lower confidence bound for it: the first time whose one-sided lower bound on
  ``S`` (``KMCurve.lower``) is ``<= 1 - q`` (``max_observed_s`` when there is none). The largest
  duration seen, the bound used before, is not one: a long censored duration can lie above
  the quantile. The controller stores the bound in the history row as
  ``details.quantile_lower_bounds_s`` (see ``jobs``).
* ``target_s`` for a ``budget`` b: the smallest observed first-token time ``t`` whose upper
  confidence bound on ``S(t)`` is ``<= b``. A primary threshold set there hedges at most a
  fraction b of calls with the stated confidence (pointwise). Since the upper bound is never below
  ``S(t)``, ``target_s >= `` the ``1 - b`` quantile whenever both exist. ``None`` when no observed
  time qualifies (too few samples, or the budget quantile lies in the censored region).
* ``target_all_events_s`` tells those two apart when ``target_s`` is ``None`` and some samples
  are censored: the same target with every censored sample counted as a first token at its
  censoring time. ``None`` there too means too few samples for the budget's tail (the policy
  holds); a value means censoring is what hides the target (the policy may raise).
  A time only counts there while at least ``n * budget / 2`` samples are at risk (a bound that
  gets under the budget on the last one or two samples is a sample-size artefact).
  Example (``tests/controller/policy/test_estimation.py``): 120 lognormal TTFTs with 3 censored at
  budget 0.05: the all-events bound first gets under 0.05 at the 119th sorted sample, where 2
  samples are at risk (< 120 * 0.05 / 2 = 3), so both targets are ``None`` (too few samples);
  1,000 samples censored above 0.85 s at budget 0.10 give ``target_s = None`` but
  ``target_all_events_s = 0.85`` s (588 at risk): censoring hides the target.
  ``TTFTEstimate.too_few_for_budget`` is that first case.

Worked number (the code's own output; ``tests/controller/policy/test_estimation.py`` checks it):
1,000 uncensored draws of a lognormal TTFT (sigma 0.6, median 1.0 s, so true P90 =
exp(0.6 * 1.2816) = 2.157 s), drawn by ``lognorm(s=0.6).rvs(1000,
random_state=default_rng(5))``, budget 0.10, confidence 0.95: KM P90 = 2.144 s and target_s =
2.249 s, the 919th of the 1,000 sorted samples, where S = 0.081 and its upper bound is 0.0990
(0.1001 at the 918th). The target sits 5% above P90; a primary threshold there hedges a true
P(TTFT > 2.249 s) = 8.8% of calls, under the 10% budget.

Sources: E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations",
JASA 53 (1958) 457-481; M. Greenwood (1926) for the variance; J. D. Kalbfleisch and
R. L. Prentice, "The Statistical Analysis of Failure Time Data" (1980) for the log-log interval;
scipy docs: ``scipy.stats.ecdf``, ``scipy.stats.CensoredData``,
``EmpiricalDistributionFunction.confidence_interval``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hedgerow.controller.policy._km import RiskTable, risk_table
from hedgerow.controller.policy.hedge_model import SurvivalCurve

__all__ = ["CI_METHOD", "QUANTILE_LEVELS", "KMCurve", "TTFTEstimate", "estimate_ttft"]

#: The quantile levels reported in a ``TTFTEstimate`` (field name -> probability).
QUANTILE_LEVELS: dict[str, float] = {
    "p50_s": 0.50,
    "p75_s": 0.75,
    "p90_s": 0.90,
    "p95_s": 0.95,
    "p99_s": 0.99,
}

#: The scipy confidence-interval method used for the survival function (see module docstring).
CI_METHOD = "log-log"

# Absolute slack when comparing a KM probability with a level: F(t) is a running product, so an
# exact 0.9 can come out as 0.8999999999999999.
_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class KMCurve:
    """The Kaplan-Meier survival curve of one window with its pointwise confidence bounds.

    Evaluated at every distinct duration (first-token and censoring times alike), so that a
    bound can be read anywhere up to ``max_observed_s``.

    Attributes:
        times_s: the distinct durations, seconds, ascending, shape (m,).
        survival: ``S(t) = P(TTFT > t)`` from each time on, shape (m,).
        upper: the upper bound of the two-sided ``confidence`` log-log interval on ``S``
            (one-sided ``(1 + confidence) / 2``: 97.5% at 0.95), shape (m,); NaN where
            undefined except where ``S = 0`` (exact binomial fill, see ``_fill_upper_at_zero``).
        lower: the one-sided ``confidence`` lower bound on ``S`` (the log-log interval at
            two-sided level ``2 * confidence - 1``: 90% two-sided gives a 95% one-sided bound),
            shape (m,); NaN read as 0 (nothing proven).
        upper_one_sided: the one-sided ``confidence`` upper bound on ``S`` (the other end of
            that interval), shape (m,); NaN read as 1 (nothing proven). The policy keeps a
            published value while this bound is within the budget (a new value must meet
            ``upper``, the stricter one).
        event: True where a first token was observed at that time, shape (m,).
        samples: the number of durations.
        max_observed_s: the largest duration, seconds.
    """

    times_s: np.ndarray
    survival: np.ndarray
    upper: np.ndarray
    lower: np.ndarray
    event: np.ndarray
    samples: int
    max_observed_s: float
    upper_one_sided: np.ndarray

    def _at(self, values: np.ndarray, t_s: np.ndarray | float, before: float) -> np.ndarray:
        index = np.searchsorted(self.times_s, np.asarray(t_s, dtype=float), side="right") - 1
        return np.where(index < 0, before, values[np.maximum(index, 0)])

    def upper_at(self, t_s: np.ndarray | float) -> np.ndarray:
        """The upper bound on ``S`` at ``t_s`` (seconds, any shape); NaN read as 1."""
        return self._at(np.where(np.isfinite(self.upper), self.upper, 1.0), t_s, 1.0)

    def upper_one_sided_at(self, t_s: np.ndarray | float) -> np.ndarray:
        """The one-sided upper bound on ``S`` at ``t_s`` (seconds, any shape); NaN read as 1."""
        return self._at(np.where(np.isfinite(self.upper_one_sided), self.upper_one_sided, 1.0), t_s, 1.0)

    def lower_at(self, t_s: np.ndarray | float) -> np.ndarray:
        """The one-sided lower bound on ``S`` at ``t_s`` (seconds, any shape); NaN read as 0."""
        return self._at(np.where(np.isfinite(self.lower), self.lower, 0.0), t_s, 1.0)

    def quantile_lower_bound_s(self, q: float) -> float:
        """A one-sided ``confidence`` lower bound on the TTFT quantile ``q``, seconds.

        ``x_q > t`` whenever ``S(t) > 1 - q``, so with ``tau`` the first time whose lower bound
        on ``S`` is ``<= 1 - q``, the bound ``S(t) >= L(t) > 1 - q`` for every ``t < tau``
        gives ``x_q >= tau`` with the bound's confidence. When the lower bound stays above
        ``1 - q`` up to the last duration, ``tau`` is ``max_observed_s``. Worked number
        (``tests/controller/policy/test_estimation.py``): 200 draws of Exp(1) censored at 1.0 s
        (true P90 = 2.303 s): the bound for P90 is 1.0 s; the old "largest duration seen"
        answer would be the same here but can exceed the quantile when a few long durations
        are censored at large times (the issue's 3 of 14 cases).
        """
        lower = self.lower_at(self.times_s)
        below = np.flatnonzero(lower <= 1.0 - q + _EPS)
        return float(self.times_s[below[0]]) if below.size else self.max_observed_s

    def lowest_supported_s(self, budget: float) -> float:
        """The smallest time whose one-sided lower bound on ``S`` is ``<= budget``, seconds.

        Below it the data show the budget exceeded (``S(t) >= L(t) > budget`` with the bound's
        confidence); from it on they do not. The policy leaves a censored region there instead
        of doubling the threshold. ``max_observed_s`` when the bound never gets under the
        budget (the data show the budget exceeded at every duration seen).
        """
        lower = self.lower_at(self.times_s)
        ok = np.flatnonzero(lower <= budget + _EPS)
        return float(self.times_s[ok[0]]) if ok.size else self.max_observed_s

    def survival_curve(self) -> SurvivalCurve:
        """The curve as ``hedge_model.SurvivalCurve`` (steps at first-token times only)."""
        return SurvivalCurve(self.times_s[self.event], self.survival[self.event], self.samples)


def km_curve(table: RiskTable, confidence: float, survival: np.ndarray | None = None) -> KMCurve | None:
    """The ``KMCurve`` of a sample's risk table, or None when every sample is censored.

    Args:
        table: the sample's ``_km.RiskTable``.
        confidence: the level of ``KMCurve.upper`` (two-sided) and of the one-sided bounds.
        survival: ``table.survival()`` when already computed.
    """
    events = table.event_mask
    if not events.any():
        return None
    survival = table.survival() if survival is None else survival
    times = table.times_s
    _, high = table.loglog_bounds(confidence, survival)
    one_low, one_high = table.loglog_bounds(max(2.0 * confidence - 1.0, 0.01), survival)
    upper = _fill_upper_at_zero(high, survival, table.at_risk, confidence)
    lower = np.where(survival <= 0.0, 0.0, one_low)
    upper_one_sided = np.where(survival <= 0.0, upper, one_high)
    max_observed_s = float(times[-1])
    return KMCurve(times, survival, upper, lower, events, int(table.total), max_observed_s, upper_one_sided)


@dataclass(frozen=True, slots=True)
class TTFTEstimate:
    """Kaplan-Meier summary of the primary's TTFT over one window.

    Attributes:
        samples: number of primary TTFT samples, censored ones included.
        censored: how many of them are right-censored (primary cancelled before a first token).
        p50_s, p75_s, p90_s, p95_s, p99_s: KM quantiles in seconds; ``None`` when the data cannot
            identify the quantile (the KM CDF never reaches the level).
        max_observed_s: the largest duration seen (censored or not), seconds; a lower bound for
            any quantile that is ``None``.
        budget: the hedge budget (fraction in (0, 1)) ``target_s`` was computed for, or ``None``.
        target_s: smallest observed first-token time whose upper confidence bound on
            ``S(t) = P(TTFT > t)`` is ``<= budget``, seconds; ``None`` when no observed time
            qualifies or no budget was given.
        target_all_events_s: when ``target_s`` is ``None`` and some samples are censored, the
            target computed with every censored sample counted as a first token at its
            censoring time (the most favourable reading of the censored primaries), seconds;
            ``None`` otherwise, or when even that reading qualifies no time: then the samples
            are too few for the budget's tail and censoring is not what hides the target.
        max_censored_s: the largest censoring time, seconds; ``None`` without censored samples.
    """

    samples: int
    censored: int
    p50_s: float | None
    p75_s: float | None
    p90_s: float | None
    p95_s: float | None
    p99_s: float | None
    max_observed_s: float
    budget: float | None
    target_s: float | None
    target_all_events_s: float | None = None
    max_censored_s: float | None = None
    curve: KMCurve | None = None

    @property
    def too_few_for_budget(self) -> bool:
        """True when a budget was given, no time qualifies as its target, and censoring is not
        the reason: nothing is censored, or ``target_all_events_s`` is ``None`` too. More
        samples (a wider window) are what would help, not a higher threshold."""
        return (
            self.budget is not None
            and self.target_s is None
            and (self.censored == 0 or self.target_all_events_s is None)
        )

    def quantile_lower_bound_s(self, q: float) -> float | None:
        """Return a lower bound in seconds for the TTFT quantile ``q``.

        Args:
            q: one of the reported levels 0.5, 0.75, 0.9, 0.95, 0.99.

        Returns:
            The KM quantile when it is identified, else a one-sided confidence lower bound
            (``KMCurve.quantile_lower_bound_s``; ``max_observed_s`` when no curve was kept, i.e.
            every sample censored). ``None`` is never returned for a valid level; the return
            type allows it only for symmetry with the quantile fields.

        Raises:
            ValueError: ``q`` is not one of the reported levels.
        """
        for name, level in QUANTILE_LEVELS.items():
            if math.isclose(q, level):
                value = getattr(self, name)
                if value is not None:
                    return float(value)
                if self.curve is None:
                    return self.max_observed_s
                return self.curve.quantile_lower_bound_s(level)
        raise ValueError(f"q must be one of {sorted(QUANTILE_LEVELS.values())}, got {q!r}")


def _flags(censored: Sequence[bool] | np.ndarray) -> np.ndarray:
    """``censored`` as a bool array; every entry must be a bool (or 0 or 1).

    Raises:
        ValueError: the first entry that is not, named by its index.
    """
    values = np.asarray(censored)
    if values.dtype == np.bool_:
        return values
    if values.dtype.kind in "iuf":
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"censored[{i}] = {values[i].item()!r}: must be a bool")
        return values.astype(bool)
    flags = list(censored)
    for i, flag in enumerate(flags):
        if not isinstance(flag, (bool, np.bool_)) and (isinstance(flag, str) or flag not in (0, 1)):
            raise ValueError(f"censored[{i}] = {flag!r}: must be a bool")
    return np.asarray([bool(flag) for flag in flags], dtype=bool)


def _validate(
    durations_s: Sequence[float] | np.ndarray,
    censored: Sequence[bool] | np.ndarray,
    budget: float | None,
    confidence: float,
    weights: Sequence[float] | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Check the inputs of ``estimate_ttft``; return them as numpy arrays (float, bool, float
    weights or None)."""
    try:
        n_durations = len(durations_s)
        n_censored = len(censored)
    except TypeError as exc:
        raise ValueError(f"durations_s and censored must be sequences: {exc}") from None
    if n_durations == 0:
        raise ValueError("durations_s is empty: at least one TTFT sample is needed")
    if n_durations != n_censored:
        raise ValueError(f"durations_s and censored differ in length ({n_durations} != {n_censored})")
    try:
        durations = np.asarray(durations_s, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"durations_s must hold numbers (seconds): {exc}") from None
    if durations.ndim != 1:
        raise ValueError(f"durations_s must be one-dimensional, got shape {durations.shape}")
    bad = np.flatnonzero(~np.isfinite(durations) | (durations < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"durations_s[{i}] = {durations[i]!r}: durations must be finite and >= 0 seconds ({bad.size} bad value(s))"
        )
    flags = _flags(censored)
    w: np.ndarray | None = None
    if weights is not None:
        try:
            w = np.asarray(weights, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"weights must hold whole numbers >= 1: {exc}") from None
        if w.shape != durations.shape:
            raise ValueError(f"weights has shape {w.shape}, durations_s {durations.shape}")
        bad = np.flatnonzero(~np.isfinite(w) | (w < 1) | (w != np.floor(w)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"weights[{i}] = {w[i].item()!r}: weights must be whole numbers >= 1")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < 1):
        raise ValueError(f"budget must be a fraction in (0, 1) or None, got {budget!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return durations, flags, w


def _fill_upper_at_zero(upper: np.ndarray, sf: np.ndarray, at_risk: np.ndarray, confidence: float) -> np.ndarray:
    """Replace the undefined (NaN) upper bound where ``S(t) = 0`` by an exact binomial bound.

    At such a time every one of the ``n`` primaries still at risk had its first token by ``t``.
    The one-sided Clopper-Pearson upper bound on the chance of outlasting ``t`` given survival
    to just before it is ``1 - (alpha / 2) ** (1 / n)`` (``alpha = 1 - confidence``; zero events
    out of ``n``); multiplied by the upper bound just before ``t`` it bounds ``S(t)``. Example:
    1,000 identical TTFTs of 0.5 s give an upper bound of 0.0037 at 0.5 s, so 0.5 s is the
    target at any budget above that, instead of no target at all.

    Args:
        upper: the log-log upper bound at each time, shape (m,).
        sf: ``S`` at each time, shape (m,).
        at_risk: the weight at risk at each time (``RiskTable.at_risk``), shape (m,).
        confidence: the bound's two-sided level.
    """
    upper = np.array(upper, dtype=float)
    alpha = 1.0 - confidence
    for j in np.flatnonzero(~np.isfinite(upper) & (sf <= 0.0)):
        before = upper[j - 1] if j > 0 and np.isfinite(upper[j - 1]) else 1.0
        upper[j] = before * (1.0 - (alpha / 2.0) ** (1.0 / max(int(at_risk[j]), 1)))
    return upper


def _target_all_events(
    durations: np.ndarray, weights: np.ndarray | None, budget: float, confidence: float
) -> float | None:
    """The budget target with every sample counted as an observed first token, seconds, or None.

    Counting a censored primary as a first token at its censoring time ``c`` (it was at least
    that slow, so this is the most favourable reading) gives the lowest survival curve and the
    tightest bound the censored samples could ever allow. A time qualifies when its upper
    confidence bound is ``<= budget`` **and** at least ``n * budget / 2`` samples are still at
    risk there (half the expected count beyond the budget quantile): a bound that only gets
    under the budget on the last one or two samples rests on too few of them to be worth a
    raise. ``None`` (no time qualifies) means the budget's tail is out of reach for this
    sample size, whatever the censored primaries would have shown (see ``policy`` rule 3).
    Example: 120 samples at budget 0.05 need 3 at risk; the all-events bound of the ops
    review's repro first gets under 0.05 at the 119th sorted sample (2 at risk): ``None``.
    """
    table = risk_table(durations, np.zeros(durations.size, dtype=bool), weights)
    sf = table.survival()
    times = table.times_s
    _, high = table.loglog_bounds(confidence, sf)
    upper = _fill_upper_at_zero(high, sf, table.at_risk, confidence)
    at_risk = table.at_risk
    enough = at_risk >= table.total * budget / 2.0
    ok = np.flatnonzero(np.isfinite(upper) & (upper <= budget + _EPS) & enough)
    return float(times[ok[0]]) if ok.size else None


def estimate_ttft(
    durations_s: Sequence[float] | np.ndarray,
    censored: Sequence[bool] | np.ndarray,
    *,
    budget: float | None = None,
    confidence: float = 0.95,
    weights: Sequence[float] | np.ndarray | None = None,
) -> TTFTEstimate:
    """Kaplan-Meier quantiles and the budget target of right-censored primary TTFTs.

    Args:
        durations_s: one duration per primary attempt, seconds, shape (n,): the TTFT when the
            primary produced a first token, else the time it was cancelled at (``end_s -
            start_s``). Failed attempts are not samples and must not be passed.
        censored: shape (n,), ``True`` where the matching duration is a censoring time
            (TTFT > duration), ``False`` where it is an observed TTFT.
        budget: hedge budget, a fraction in (0, 1); when given, ``target_s`` is computed.
        confidence: level of the pointwise log-log confidence interval on ``S(t)``, in (0, 1).
        weights: how many samples each entry stands for (whole numbers >= 1), shape (n,); None:
            1 each. A histogram's (bucket duration, censored, count) entries give the estimate
            of the samples it counts; ``samples`` and ``censored`` are then sums of weights.

    Returns:
        A ``TTFTEstimate``; quantiles the data cannot identify, and ``target_s`` when no observed
        time qualifies, are ``None``.

    Raises:
        ValueError: empty input, ``durations_s`` and ``censored`` of different lengths, a
            negative, NaN or infinite duration, a non-bool censoring flag, ``budget`` outside
            (0, 1), ``confidence`` outside (0, 1), or a weight that is not a whole number >= 1.
            The message names the argument.

    Source: Kaplan & Meier (1958), computed by ``_km.risk_table`` (the arithmetic of
    ``scipy.stats.ecdf`` on ``scipy.stats.CensoredData``, with weights).
    """
    durations, is_censored, w = _validate(durations_s, censored, budget, confidence, weights)
    table = risk_table(durations, is_censored, w)
    samples = int(table.total)
    n_censored = samples - int(table.events.sum())
    max_observed_s = float(table.times_s[-1])

    quantiles: dict[str, float | None] = dict.fromkeys(QUANTILE_LEVELS)
    target_s: float | None = None
    curve: KMCurve | None = None
    if n_censored < samples:  # at least one first token: the KM curve has a step
        sf = table.survival()
        curve = km_curve(table, confidence, sf)
        # Only times at which a first token was observed are candidates: S(t) steps there.
        events = table.event_mask
        event_times = table.times_s[events]
        event_cdf = 1.0 - sf[events]
        for name, level in QUANTILE_LEVELS.items():
            reached = np.flatnonzero(event_cdf >= level - _EPS)
            quantiles[name] = float(event_times[reached[0]]) if reached.size else None
        if budget is not None:
            _, high = table.loglog_bounds(confidence, sf)
            upper = _fill_upper_at_zero(high[events], sf[events], table.at_risk[events], confidence)
            ok = np.flatnonzero(np.isfinite(upper) & (upper <= budget + _EPS))
            target_s = float(event_times[ok[0]]) if ok.size else None
    target_all_events_s: float | None = None
    if budget is not None and target_s is None and n_censored > 0:
        target_all_events_s = _target_all_events(durations, w, budget, confidence)

    return TTFTEstimate(
        samples=samples,
        censored=n_censored,
        p50_s=quantiles["p50_s"],
        p75_s=quantiles["p75_s"],
        p90_s=quantiles["p90_s"],
        p95_s=quantiles["p95_s"],
        p99_s=quantiles["p99_s"],
        max_observed_s=max_observed_s,
        budget=None if budget is None else float(budget),
        target_s=target_s,
        target_all_events_s=target_all_events_s,
        max_censored_s=float(durations[is_censored].max()) if n_censored else None,
        curve=curve,
    )
