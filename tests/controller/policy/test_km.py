"""The risk tables of ``_km``: equal to scipy's Kaplan-Meier and log-rank with unit weights, and
weights that behave as repeated samples."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from hedgerow.controller.policy._km import (
    DurationIndex,
    at_risk_of,
    km_quantiles,
    km_survival_rows,
    logrank_rows,
    logrank_z,
    risk_table,
)
from hedgerow.controller.policy.estimation import estimate_ttft


def _sample(seed: int, n: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    durations = rng.lognormal(np.log(0.5), 0.8, n)
    if ties:
        durations = np.round(durations, 1)  # many tied durations, events and censorings alike
    censored = rng.random(n) < 0.3
    return durations, censored


def _scipy_sf(durations: np.ndarray, censored: np.ndarray):  # type: ignore[no-untyped-def]
    return stats.ecdf(stats.CensoredData(uncensored=durations[~censored], right=durations[censored])).sf


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_weights_give_scipys_curve_and_interval_to_the_bit(seed: int, ties: bool) -> None:
    durations, censored = _sample(seed, 500, ties)
    sf = _scipy_sf(durations, censored)
    table = risk_table(durations, censored)
    survival = table.survival()
    assert np.array_equal(table.times_s, sf.quantiles)
    assert np.array_equal(survival, sf.probabilities)
    for level in (0.95, 0.9):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            interval = sf.confidence_interval(confidence_level=level, method="log-log")
        low, high = table.loglog_bounds(level, survival)
        assert np.array_equal(low, interval.low.probabilities, equal_nan=True)
        assert np.array_equal(high, interval.high.probabilities, equal_nan=True)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("shift", [1.0, 1.3])
def test_unit_weights_give_scipys_logrank(ties: bool, shift: float) -> None:
    x_d, x_c = _sample(3, 400, ties)
    y_d, y_c = _sample(4, 700, ties)
    y_d = y_d * shift
    ours = logrank_z(risk_table(x_d, x_c), risk_table(y_d, y_c))
    theirs = stats.logrank(
        stats.CensoredData(uncensored=x_d[~x_c], right=x_d[x_c]),
        stats.CensoredData(uncensored=y_d[~y_c], right=y_d[y_c]),
    ).statistic
    assert ours == pytest.approx(float(theirs), rel=1e-12, abs=1e-12)


def test_a_weight_is_that_many_repeated_samples() -> None:
    durations, censored = _sample(5, 300, ties=True)
    # collapse to distinct (duration, censored) pairs with counts: a histogram of the sample
    pairs, counts = np.unique(np.column_stack((durations, censored)), axis=0, return_counts=True)
    weighted = risk_table(pairs[:, 0], pairs[:, 1].astype(bool), counts)
    plain = risk_table(durations, censored)
    assert np.array_equal(weighted.times_s, plain.times_s)
    assert np.array_equal(weighted.at_risk, plain.at_risk)
    assert np.array_equal(weighted.events, plain.events)
    a = estimate_ttft(pairs[:, 0], pairs[:, 1].astype(bool), weights=counts, budget=0.1)
    b = estimate_ttft(durations, censored, budget=0.1)
    assert (a.samples, a.censored, a.p50_s, a.p90_s, a.p99_s, a.target_s) == (
        b.samples,
        b.censored,
        b.p50_s,
        b.p90_s,
        b.p99_s,
        b.target_s,
    )
    assert a.samples == 300 and a.censored == int(censored.sum())


def test_quantile_and_at_risk_reads() -> None:
    # 4 first tokens at 1, 2, 3, 4 s; one censored at 2.5 s
    table = risk_table(np.array([1.0, 2.0, 2.5, 3.0, 4.0]), np.array([False, False, True, False, False]))
    assert table.at_risk.tolist() == [5, 4, 3, 2, 1]
    # S: 4/5 = 0.8 from 1 s, 0.8 * 3/4 = 0.6 from 2 s (and at 2.5 s), 0.6 * 1/2 = 0.3 from 3 s, 0
    assert table.survival() == pytest.approx([0.8, 0.6, 0.6, 0.3, 0.0])
    assert table.quantile_s(0.5) == 3.0
    assert table.quantile_s(0.4) == 2.0
    assert table.quantile_s(0.99) == 4.0
    assert table.at_risk_at(np.array([0.0, 2.5, 2.6, 9.0])).tolist() == [5, 3, 2, 0]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1, 0], r"weights\[1\] = 0.0: weights must be whole numbers >= 1"),
        ([1, 1.5], r"weights\[1\] = 1.5"),
        ([1, float("nan")], r"weights\[1\] = nan"),
        ([1], r"weights has shape \(1,\), durations_s \(2,\)"),
        (["a", 1], "weights must hold whole numbers"),
    ],
)
def test_bad_weights_are_named(weights: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate_ttft([1.0, 2.0], [False, False], weights=weights)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nested_parts_counted_at_once_are_their_sorted_tables_to_the_bit(seed: int) -> None:
    """``DurationIndex.cumulative`` rows (the drift tests' recent parts at many splits) and the
    rest of the sample give each part's ``risk_table`` at its own times, its survival and
    quantiles, and ``logrank_rows`` gives ``logrank_z`` of the two parts, bit for bit, with
    ties (bucket ends) and whole-number weights (minute counts)."""
    rng = np.random.default_rng(seed)
    n = 400
    durations = np.round(rng.lognormal(-1.0, 0.8, n), 2)  # many ties
    censored = rng.random(n) < 0.2
    weights = rng.integers(1, 9, n).astype(float)
    group = rng.integers(0, 6, n)  # rows 0..3: entries of group <= row; 4 and 5 in no row
    grid = DurationIndex.of(durations, censored, weights)
    weight, died = grid.cumulative(group, 4)
    total_weight, total_died = grid.totals()
    events = total_died > 0
    parts = [(weight, died), (total_weight - weight, total_died - died)]
    statistics = logrank_rows(
        at_risk_of(weight)[:, events],
        at_risk_of(total_weight - weight)[:, events],
        died[:, events],
        total_died[events],
        died.sum(axis=1),
    )
    for row in range(4):
        masks = [group <= row, group > row]
        tables = []
        for (w, d), mask in zip(parts, masks, strict=True):
            sorted_ = risk_table(durations[mask], censored[mask], weights[mask])
            tables.append(sorted_)
            present = w[row] > 0
            assert np.array_equal(grid.times_s[present], sorted_.times_s)
            assert np.array_equal(at_risk_of(w[row])[present], sorted_.at_risk)
            assert np.array_equal(d[row][present], sorted_.events)
            survival = km_survival_rows(at_risk_of(w[row]), d[row])
            assert np.array_equal(survival[present], sorted_.survival())
            for q in (0.5, 0.9, 0.99):
                found = float(km_quantiles(grid.times_s, survival, q))
                want = sorted_.quantile_s(q)
                assert (math.isnan(found) and want is None) or found == want
        z = logrank_z(tables[0], tables[1])
        assert statistics[row] == z or (math.isnan(z) and math.isnan(statistics[row]))
