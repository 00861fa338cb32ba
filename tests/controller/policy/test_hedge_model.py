"""Tests of the hedged-call TTFT model (``hedgerow.controller.policy.hedge_model``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from hedgerow.controller.policy.estimation import estimate_ttft
from hedgerow.controller.policy.hedge_model import (
    BucketReplay,
    SurvivalCurve,
    denial_probabilities,
    efficient_threshold,
    km_survival,
    predicted_quantile_levels,
    predicted_quantiles,
    predicted_survival,
    win_probability,
)


def _exp_samples(n: int, mean_s: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).exponential(mean_s, n)


def test_km_survival_without_censoring_is_the_empirical_survival() -> None:
    x = np.array([0.3, 0.1, 0.2, 0.2, 0.5])
    s = km_survival(x, [False] * 5)
    assert s.samples == 5
    assert list(s.times_s) == [0.1, 0.2, 0.3, 0.5]
    assert s([0.0, 0.1, 0.15, 0.2, 0.3, 0.49, 0.5, 9.0]).tolist() == pytest.approx(
        [1.0, 0.8, 0.8, 0.4, 0.2, 0.2, 0.0, 0.0]
    )


def test_km_survival_keeps_its_last_value_beyond_the_data() -> None:
    # the longest duration is censored: S stays at its last value (an upper bound) beyond it
    s = km_survival([0.1, 0.2, 0.3, 1.0], [False, False, False, True])
    assert s.last_value == pytest.approx(0.25)
    assert float(s(50.0)) == pytest.approx(0.25)
    everything_censored = km_survival([0.1, 0.2], [True, True])
    assert float(everything_censored(10.0)) == 1.0 and everything_censored.last_value == 1.0


def test_predicted_survival_is_the_product_after_the_threshold() -> None:
    primary = SurvivalCurve(np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.2, 0.0]), 10)
    backup = SurvivalCurve(np.array([0.5, 1.5]), np.array([0.4, 0.0]), 10)
    x = np.array([0.5, 1.0, 1.4, 1.6, 2.0, 2.6])
    got = predicted_survival(primary, backup, 1.2, x)
    # x < 1.2: S(x); x >= 1.2: S(x) * G(x - 1.2)
    assert got.tolist() == pytest.approx([1.0, 0.5, 0.5 * 1.0, 0.5 * 1.0, 0.2 * 0.4, 0.2 * 0.4])


def test_predicted_p99_matches_the_closed_form_of_two_exponentials() -> None:
    # T ~ Exp(mean 1 s), B ~ Exp(mean 0.5 s), hedged at t: P(T > x) = exp(-x) * exp(-2 (x - t))
    primary = km_survival(_exp_samples(40_000, 1.0, 1), [False] * 40_000)
    backup = km_survival(_exp_samples(40_000, 0.5, 2), [False] * 40_000)
    thresholds = np.array([0.5, 1.0, 2.0, 10.0])
    got = predicted_quantiles(primary, backup, thresholds)
    expected = [(math.log(100) + 2 * t) / 3 if t < math.log(100) else math.log(100) for t in thresholds]
    assert got == pytest.approx(expected, rel=0.04)


def test_the_model_recovers_the_hedged_p99_from_censored_records() -> None:
    # What the controller sees: primaries censored when the backup won, backups censored when the
    # primary won. KM on both and the model give the P99 the calls really had.
    rng = np.random.default_rng(3)
    n, t = 30_000, 1.2
    primary_ttft = rng.exponential(1.0, n)
    backup_ttft = rng.exponential(0.4, n)
    hedged = primary_ttft > t
    backup_first = hedged & (t + backup_ttft < primary_ttft)
    call_ttft = np.where(backup_first, t + backup_ttft, primary_ttft)
    primary = km_survival(np.where(backup_first, t + backup_ttft, primary_ttft), backup_first)
    backup = km_survival(np.where(backup_first, backup_ttft, primary_ttft - t)[hedged], ~backup_first[hedged])
    predicted = float(predicted_quantiles(primary, backup, np.array([t]))[0])
    assert predicted == pytest.approx(float(np.quantile(call_ttft, 0.99)), rel=0.05)
    # the win probability matches the observed backup win rate
    assert win_probability(primary, backup, t) == pytest.approx(backup_first.sum() / hedged.sum(), abs=0.03)


def test_win_probability_of_memoryless_ttfts() -> None:
    # Exp(1) primary, Exp(rate 2) backup: P(B < remaining primary) = 2 / (2 + 1) at any t
    primary = km_survival(_exp_samples(50_000, 1.0, 4), [False] * 50_000)
    backup = km_survival(_exp_samples(50_000, 0.5, 5), [False] * 50_000)
    for t in (0.2, 1.0):
        assert win_probability(primary, backup, t) == pytest.approx(2 / 3, abs=0.03)
    assert win_probability(primary, backup, 1e6) is None  # nobody is still waiting


def test_unidentified_tail_gives_infinite_quantile() -> None:
    # half the primaries censored at 1 s: S never drops under 0.5, the P99 is not identified
    primary = km_survival([0.1] * 50 + [1.0] * 50, [False] * 50 + [True] * 50)
    assert np.isinf(predicted_quantiles(primary, primary, np.array([5.0]))).all()
    choice = efficient_threshold(primary, None, 0.5, 30.0, tolerance=0.02)
    assert choice.hedge_after_s == 0.5 and math.isinf(choice.min_p99_s)


def test_worked_number_in_module_docstring() -> None:
    rng = np.random.default_rng(7)
    n = 10_000
    kind = rng.choice(3, size=n, p=[0.87, 0.12, 0.01])
    ttft = np.where(
        kind == 0, rng.uniform(0.05, 0.3, n), np.where(kind == 1, rng.uniform(0.45, 0.55, n), rng.uniform(1.0, 5.0, n))
    )
    censored = np.zeros(n, dtype=bool)
    estimate = estimate_ttft(ttft, censored, budget=0.10)
    primary = km_survival(ttft, censored)
    assert estimate.target_s == pytest.approx(0.483, abs=5e-4)
    assert estimate.p99_s == pytest.approx(0.5494, abs=5e-5)
    assert estimate.target_s is not None and estimate.p99_s is not None
    choice = efficient_threshold(primary, None, estimate.target_s, estimate.p99_s, tolerance=0.02)
    assert choice.backup_source == "primary"
    assert float(primary(estimate.target_s)) == pytest.approx(0.094, abs=5e-4)
    assert choice.win_probability_at_budget == pytest.approx(0.105, abs=5e-4)
    assert choice.p99_at_budget_s == pytest.approx(0.5492, abs=5e-5)
    assert choice.hedge_after_s == pytest.approx(0.5494, abs=5e-5)
    assert choice.p99_at_choice_s == pytest.approx(0.5494, abs=5e-5)
    assert float(primary(choice.hedge_after_s)) == pytest.approx(0.010, abs=5e-4)
    assert choice.win_probability_at_choice == pytest.approx(0.93, abs=5e-3)
    p999 = predicted_quantiles(primary, primary, np.array([estimate.target_s, choice.hedge_after_s]), 0.999)
    assert p999.tolist() == pytest.approx([0.956, 1.021], abs=5e-4)


def test_efficient_threshold_stays_at_the_budget_target_when_earlier_hedges_pay() -> None:
    # memoryless primary and a fast backup: every delay of the hedge adds to the tail
    primary = km_survival(_exp_samples(20_000, 1.0, 6), [False] * 20_000)
    backup = km_survival(_exp_samples(20_000, 0.2, 7), [False] * 20_000)
    choice = efficient_threshold(primary, backup, 2.3, 4.6, tolerance=0.0)
    assert choice.hedge_after_s == pytest.approx(2.3)
    assert choice.backup_source == "backup"
    wider = efficient_threshold(primary, backup, 2.3, 4.6, tolerance=0.10)
    assert 2.3 < wider.hedge_after_s < 4.6
    assert wider.p99_at_choice_s <= 1.10 * wider.min_p99_s + 1e-9


def test_bucket_replay_counts_denials_in_arrival_order() -> None:
    # 40 calls, every primary slow (5 s): at t = 1 s each wants a hedge. A bucket of 2 tokens
    # (full) refilled by 0.25 per call grants the first 2 (the burst) and then one call in four.
    n = 40
    durations = np.full(n, 5.0)
    censored = np.zeros(n, dtype=bool)
    primary = km_survival(durations, censored)
    replay = BucketReplay(durations, censored, budget=0.25, burst=2.0)
    denied = denial_probabilities(primary, replay, np.array([1.0, 6.0]))
    assert denied.shape == (n, 2)
    assert denied[:, 1].sum() == 0  # at t = 6 s nobody wants a hedge
    granted = n - int(denied[:, 0].sum())
    assert granted == 2 + 9  # burst, then 38 calls * 0.25 = 9.5 tokens -> 9 whole hedges
    # tokens after each call: 1, 0.25, then 0.5 and 0.75 (denied), then 1.0 at the 5th: granted
    assert denied[:6, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]


def test_replayed_denials_raise_the_predicted_tail() -> None:
    rng = np.random.default_rng(8)
    n = 5000
    durations = np.where(rng.random(n) < 0.3, rng.uniform(2.0, 4.0, n), rng.uniform(0.1, 0.5, n))
    censored = np.zeros(n, dtype=bool)
    primary = km_survival(durations, censored)
    backup = km_survival(rng.uniform(0.1, 0.3, n), censored)
    t = np.array([1.0])
    free = predicted_quantiles(primary, backup, t)
    tight = predicted_quantiles(primary, backup, t, replay=BucketReplay(durations, censored, 0.1, 10.0))
    assert free[0] < 1.5  # every slow call hedged at 1 s, backup done by 1.3 s
    assert tight[0] > 2.0  # two thirds of the wanted hedges are denied: the slow primaries stay


def test_bucket_limited_search_takes_the_smallest_best_threshold() -> None:
    # 85% fast, 12% at 0.5-0.9 s, 3% slow host at 3-5 s; bucket of 5% per call. At a 0.4 s
    # threshold 15% of the calls want a hedge, the bucket runs dry and the slow calls go
    # unhedged (predicted P99 ~3.8 s); past the 0.5-0.9 s lump the wants fit the bucket.
    rng = np.random.default_rng(12)
    n = 6000
    kind = rng.choice(3, size=n, p=[0.85, 0.12, 0.03])
    durations = np.where(
        kind == 0, rng.uniform(0.05, 0.3, n), np.where(kind == 1, rng.uniform(0.5, 0.9, n), rng.uniform(3.0, 5.0, n))
    )
    censored = np.zeros(n, dtype=bool)
    primary = km_survival(durations, censored)
    backup = km_survival(rng.uniform(0.05, 0.2, 500), np.zeros(500, dtype=bool))
    replay = BucketReplay(durations, censored, budget=0.05, burst=5.0)
    choice = efficient_threshold(primary, backup, 0.4, 3.0, tolerance=0.10, replay=replay)
    grid = np.geomspace(0.4, 3.0, 96)
    p99 = predicted_quantiles(primary, backup, grid, 0.99, replay)
    assert choice.bucket_limited is True
    assert choice.p99_at_budget_s > 3.0 * choice.min_p99_s  # the floor is predicted far worse
    # the smallest threshold reaching the best predicted P99, not the largest within 10%
    assert choice.p99_at_choice_s == choice.min_p99_s == p99.min()
    chosen = int(np.flatnonzero(grid == choice.hedge_after_s)[0])
    assert np.all(p99[:chosen] > choice.min_p99_s)
    largest_within = grid[np.flatnonzero(p99 <= 1.10 * p99.min())[-1]]
    assert largest_within > choice.hedge_after_s > 0.4
    # without the replay the curve rises with t: not bucket-limited, the tolerance rule applies
    free = efficient_threshold(primary, backup, 0.4, 3.0, tolerance=0.10)
    assert free.bucket_limited is False
    assert free.p99_at_budget_s == free.min_p99_s
    assert free.hedge_after_s > 0.4 and free.p99_at_choice_s <= 1.10 * free.min_p99_s + 1e-9


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: km_survival([], []), "non-empty"),
        (lambda: km_survival([0.1, 0.2], [False]), "differ in length"),
        (lambda: km_survival([0.1, -1.0], [False, False]), "finite and >= 0"),
        (lambda: km_survival([0.1, float("nan")], [False, False]), "finite and >= 0"),
        (lambda: SurvivalCurve(np.array([2.0, 1.0]), np.array([0.5, 0.1]), 2), "ascending"),
        (lambda: SurvivalCurve(np.array([1.0, 2.0]), np.array([0.1, 0.5]), 2), "non-increasing"),
        (
            lambda: predicted_quantiles(
                km_survival([1.0], [False]), km_survival([1.0], [False]), np.array([1.0]), q=1.0
            ),
            "q must be",
        ),
        (lambda: efficient_threshold(km_survival([1.0], [False]), None, 0.0, 1.0, tolerance=0.1), "budget_target_s"),
        (lambda: efficient_threshold(km_survival([1.0], [False]), None, 1.0, 2.0, tolerance=-0.1), "tolerance"),
    ],
)
def test_bad_input_is_a_clear_error(call: Callable[[], object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_several_levels_at_once_equal_one_level_at_a_time(seed: int) -> None:
    """``predicted_quantile_levels`` gives each level what ``predicted_quantiles`` gives it
    alone, to the bit, with and without the bucket replay and with censoring."""
    rng = np.random.default_rng(seed)
    primary_s = rng.lognormal(np.log(0.4), 0.9, 800)
    censored = rng.random(800) < 0.1
    primary = km_survival(primary_s, censored)
    backup = km_survival(rng.lognormal(np.log(0.4), 0.9, 200), np.zeros(200, dtype=bool))
    replay = BucketReplay(primary_s, censored, budget=0.1, burst=10.0)
    levels = (0.9, 0.97, 0.99, 0.999)
    # thresholds across the tail, and all above the lower levels' quantiles (where those levels'
    # quantile is the primary's own, below every threshold)
    cases = [(np.array([0.3, 0.9, 2.5]), bucket) for bucket in (None, replay)]
    cases += [(np.array([3.0, 4.0]), bucket) for bucket in (None, replay)]
    for thresholds, bucket in cases:
        together = predicted_quantile_levels(primary, backup, thresholds, levels, bucket)
        assert together.shape == (len(levels), thresholds.size)
        for row, q in zip(together, levels, strict=True):
            assert np.array_equal(row, predicted_quantiles(primary, backup, thresholds, q, bucket))
    with pytest.raises(ValueError, match="each q"):
        predicted_quantile_levels(primary, backup, thresholds, (0.5, 1.0))
