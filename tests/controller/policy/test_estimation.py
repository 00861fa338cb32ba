"""Tests of the Kaplan-Meier TTFT estimator on samples from known distributions.

The censoring is simulated the way hedging produces it: a primary whose TTFT exceeds the hedge
threshold ``h`` gets a backup at ``h``; if the backup's first token (at ``h + backup TTFT``) comes
before the primary's, the primary is cancelled then and its TTFT is censored at that time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from hedgerow.controller.policy.estimation import TTFTEstimate, estimate_ttft

#: Primary (and backup) TTFT: lognormal, median 1 s, sigma 0.6; true P90 = exp(0.6 z_0.9).
TTFT = stats.lognorm(s=0.6, scale=1.0)
TRUE_P90_S = float(TTFT.ppf(0.90))


def hedged_samples(n: int, hedge_after_s: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Primary durations and censoring flags as a hedging client with threshold h records them."""
    rng = np.random.default_rng(seed)
    primary = TTFT.rvs(n, random_state=rng)
    backup = TTFT.rvs(n, random_state=rng)
    backup_first_token = hedge_after_s + backup
    censored = (primary > hedge_after_s) & (backup_first_token < primary)
    durations = np.where(censored, backup_first_token, primary)
    return durations, censored


def test_true_p90_is_what_the_tests_assume() -> None:
    assert pytest.approx(math.exp(0.6 * 1.2815515655446004), rel=1e-9) == TRUE_P90_S
    assert pytest.approx(2.1575, abs=1e-3) == TRUE_P90_S


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_km_recovers_p90_where_uncensored_quantile_drifts_low(seed: int) -> None:
    hedge_after_s = float(TTFT.ppf(0.60))  # an aggressive threshold: 40% of primaries hedged
    durations, censored = hedged_samples(4000, hedge_after_s, seed)
    assert 0.08 < censored.mean() < 0.14  # the backup wins about a quarter of the hedges

    est = estimate_ttft(durations, censored, budget=0.10)
    naive_p90 = float(np.quantile(durations[~censored], 0.90))

    assert est.samples == 4000
    assert est.censored == int(censored.sum())
    assert est.p90_s is not None
    assert est.p90_s == pytest.approx(TRUE_P90_S, rel=0.06)
    # Dropping the censored primaries biases the quantile low by far more than that.
    assert naive_p90 < 0.85 * TRUE_P90_S
    assert abs(est.p90_s - TRUE_P90_S) < 0.3 * abs(naive_p90 - TRUE_P90_S)
    # The target, an upper-bound quantile, stays at or above the KM P90 and near the truth.
    assert est.target_s is not None
    assert est.p90_s <= est.target_s < 1.15 * TRUE_P90_S


def test_worked_number_in_module_docstring() -> None:
    x = TTFT.rvs(1000, random_state=np.random.default_rng(5))
    est = estimate_ttft(x, [False] * 1000, budget=0.10, confidence=0.95)
    assert est.p90_s == pytest.approx(2.144, abs=5e-4)
    assert est.target_s == pytest.approx(2.249, abs=5e-4)
    assert est.target_s is not None
    rank = int(np.searchsorted(np.sort(x), est.target_s)) + 1
    assert rank == 919
    assert float(TTFT.sf(est.target_s)) == pytest.approx(0.088, abs=5e-4)


def test_uncensored_quantiles_match_the_empirical_definition() -> None:
    x = np.arange(1, 101, dtype=float) / 10.0  # 0.1 .. 10.0 s
    est = estimate_ttft(x, np.zeros(100, dtype=bool))
    # smallest t with F(t) >= q, F(k/10) = k/100
    assert (est.p50_s, est.p75_s, est.p90_s, est.p95_s, est.p99_s) == (5.0, 7.5, 9.0, 9.5, 9.9)
    assert est.max_observed_s == 10.0
    assert est.budget is None and est.target_s is None
    assert est.quantile_lower_bound_s(0.9) == 9.0


def test_target_at_or_above_p90_and_falls_as_n_grows() -> None:
    mean_gap: dict[int, float] = {}
    for n in (100, 1000, 10000):
        gaps = []
        for seed in range(5):
            x = TTFT.rvs(n, random_state=np.random.default_rng(1000 * n + seed))
            est = estimate_ttft(x, np.zeros(n, dtype=bool), budget=0.10)
            assert est.target_s is not None and est.p90_s is not None
            assert est.target_s >= est.p90_s
            gaps.append(est.target_s / TRUE_P90_S - 1.0)
        mean_gap[n] = float(np.mean(gaps))
    assert mean_gap[100] > mean_gap[1000] > mean_gap[10000] > 0.0
    assert mean_gap[10000] < 0.05


def test_target_keeps_the_budget_with_high_probability() -> None:
    """The share of targets whose true exceedance is over budget stays near the nominal 2.5%."""
    rng = np.random.default_rng(11)
    over = 0
    reps = 200
    for _ in range(reps):
        x = TTFT.rvs(200, random_state=rng)
        est = estimate_ttft(x, np.zeros(200, dtype=bool), budget=0.10)
        assert est.target_s is not None
        over += float(TTFT.sf(est.target_s)) > 0.10
    assert over / reps < 0.08


def test_quantiles_in_the_censored_region_are_none() -> None:
    # Every primary slower than c is cancelled at c (a fixed deadline): nothing is known above c.
    x = TTFT.rvs(2000, random_state=np.random.default_rng(3))
    c = float(TTFT.ppf(0.80))
    censored = x > c
    durations = np.minimum(x, c)
    est = estimate_ttft(durations, censored, budget=0.10)
    assert est.p50_s is not None and est.p75_s is not None
    assert est.p75_s == pytest.approx(float(TTFT.ppf(0.75)), rel=0.05)
    assert est.p90_s is None and est.p95_s is None and est.p99_s is None
    assert est.target_s is None
    assert est.max_observed_s == pytest.approx(c)
    assert est.quantile_lower_bound_s(0.9) == pytest.approx(c)
    assert est.quantile_lower_bound_s(0.5) == est.p50_s


def test_all_censored_identifies_nothing() -> None:
    est = estimate_ttft([1.0, 2.0, 3.0], [True, True, True], budget=0.10)
    assert est == TTFTEstimate(
        samples=3,
        censored=3,
        p50_s=None,
        p75_s=None,
        p90_s=None,
        p95_s=None,
        p99_s=None,
        max_observed_s=3.0,
        budget=0.10,
        target_s=None,
        target_all_events_s=None,
        max_censored_s=3.0,
    )


def test_small_samples_have_no_target() -> None:
    # Five samples cannot show P(TTFT > t) <= 10% with 95% confidence at any observed t,
    # even though the KM curve reaches 0 at the last one (its interval is undefined there).
    est = estimate_ttft([0.5, 0.7, 0.9, 1.1, 1.3], [False] * 5, budget=0.10)
    assert est.p90_s == 1.3
    assert est.target_s is None


def test_tied_and_zero_durations_are_accepted() -> None:
    est = estimate_ttft([0.0, 0.0, 1.0, 1.0, 2.0, 0.5], [False, False, False, False, False, True])
    assert est.p50_s == 1.0
    assert est.samples == 6 and est.censored == 1


def test_quantile_lower_bound_rejects_unknown_levels() -> None:
    est = estimate_ttft([1.0, 2.0], [False, False])
    with pytest.raises(ValueError, match="q must be one of"):
        est.quantile_lower_bound_s(0.42)


@pytest.mark.parametrize(
    ("durations", "censored", "kwargs", "name"),
    [
        ([], [], {}, "durations_s"),
        ([1.0, 2.0], [False], {}, "length"),
        ([1.0, -0.1], [False, False], {}, r"durations_s\[1\]"),
        ([1.0, float("nan")], [False, False], {}, r"durations_s\[1\]"),
        ([1.0, float("inf")], [False, False], {}, r"durations_s\[1\]"),
        (["a", 1.0], [False, False], {}, "durations_s"),
        ([1.0, 2.0], [False, "yes"], {}, r"censored\[1\]"),
        ([1.0, 2.0], [False, False], {"budget": 0.0}, "budget"),
        ([1.0, 2.0], [False, False], {"budget": 1.0}, "budget"),
        ([1.0, 2.0], [False, False], {"budget": float("nan")}, "budget"),
        ([1.0, 2.0], [False, False], {"confidence": 1.0}, "confidence"),
        ([1.0, 2.0], [False, False], {"confidence": 0}, "confidence"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(
    durations: list[Any], censored: list[Any], kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        estimate_ttft(durations, censored, **kwargs)


def test_identical_ttfts_still_give_a_target() -> None:
    # 1,000 primaries all with TTFT 0.5 s: S(0.5) = 0, where the log-log interval is undefined.
    estimate = estimate_ttft([0.5] * 1000, [False] * 1000, budget=0.10)
    assert estimate.p90_s == 0.5 and estimate.p99_s == 0.5
    assert estimate.target_s == 0.5


def test_a_few_identical_ttfts_do_not_qualify_at_a_tight_budget() -> None:
    # 3 samples: the exact bound 1 - 0.025 ** (1/3) = 0.71 is above a 10% budget.
    estimate = estimate_ttft([0.5] * 3, [False] * 3, budget=0.10)
    assert estimate.target_s is None


def test_all_events_target_separates_censoring_from_sample_size() -> None:
    # Censored at a fixed 0.85 s deadline: the all-events reading qualifies at the deadline,
    # with most samples still at risk there: censoring, not sample size, hides the target.
    x = TTFT.rvs(1000, random_state=np.random.default_rng(2))
    est = estimate_ttft(np.minimum(x, 0.85), x > 0.85, budget=0.10)
    assert est.target_s is None and est.target_all_events_s == pytest.approx(0.85)
    assert est.max_censored_s == pytest.approx(0.85) and not est.too_few_for_budget
    # 120 samples with the 3 largest censored at budget 0.05: the all-events bound gets under
    # 0.05 only on the last samples (fewer than 120 * 0.05 / 2 = 3 at risk): sample size.
    y = np.sort(TTFT.rvs(120, random_state=np.random.default_rng(4)))
    flags = np.zeros(120, dtype=bool)
    flags[-3:] = True
    small = estimate_ttft(y, flags, budget=0.05)
    assert small.target_s is None and small.target_all_events_s is None
    assert small.too_few_for_budget and small.max_censored_s == pytest.approx(y[-1])
    # with an identified target neither field matters, and nothing censored: no max_censored_s
    full = estimate_ttft(x, np.zeros(1000, dtype=bool), budget=0.10)
    assert full.target_s is not None and full.target_all_events_s is None
    assert full.max_censored_s is None and not full.too_few_for_budget


# --- KMCurve: one-sided bounds ---------------------------------------------------------------


def test_quantile_lower_bound_is_a_one_sided_confidence_bound() -> None:
    # Exp(1) TTFTs, hedged at 1.0 s and cancelled there when the backup (Exp(1)) wins: the P90
    # (2.303 s) and P99 (4.605 s) are often unidentified. The largest duration seen, the old
    # "bound", can exceed the quantile; the KM one-sided 95% bound must not, but in ~5% of runs.
    rng = np.random.default_rng(11)
    above = {"p90_s": 0, "p99_s": 0}
    unidentified = {"p90_s": 0, "p99_s": 0}
    for _ in range(300):
        t = rng.exponential(1.0, 60)
        b = 1.0 + rng.exponential(0.3, 60)
        cens = (t > 1.0) & (b < t)
        est = estimate_ttft(np.where(cens, b, t), cens, budget=0.1)
        for name, q, true in (("p90_s", 0.9, np.log(10)), ("p99_s", 0.99, np.log(100))):
            if getattr(est, name) is None:
                unidentified[name] += 1
                above[name] += est.quantile_lower_bound_s(q) > true
    assert unidentified["p90_s"] > 100 and unidentified["p99_s"] > 150
    assert above["p90_s"] / unidentified["p90_s"] <= 0.08 and above["p99_s"] / unidentified["p99_s"] <= 0.08


def test_lower_bound_below_the_largest_duration_when_the_tail_is_thin() -> None:
    x = np.concatenate([np.full(97, 0.5), [5.0, 40.0, 41.0]])
    cens = np.concatenate([np.zeros(98, dtype=bool), [True, True]])  # two long censored waits
    est = estimate_ttft(x, cens, budget=0.1)
    assert est.p99_s is None and est.max_observed_s == 41.0
    lower_s = est.quantile_lower_bound_s(0.99)
    assert lower_s is not None and lower_s < est.max_observed_s


def test_lowest_supported_value_of_a_curve() -> None:
    x = stats.lognorm(s=0.6).rvs(1000, random_state=np.random.default_rng(5))
    est = estimate_ttft(x, [False] * 1000, budget=0.10)
    assert est.curve is not None
    low = est.curve.lowest_supported_s(0.10)
    # below it the one-sided lower bound on S is above the budget; the target is above it
    assert est.curve.lower_at(low) <= 0.10 < est.curve.lower_at(low - 1e-9)
    assert est.p90_s is not None and est.target_s is not None and low <= est.p90_s <= est.target_s
