"""Tests of the pruned first-crossing search (``hedgerow.controller.policy._tail_search``): it gives
what evaluating every candidate gives, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from hedgerow.controller.policy import _tail_search
from hedgerow.controller.policy._tail_search import first_at_or_below
from hedgerow.controller.policy.hedge_model import BucketReplay, km_survival, predicted_quantile_levels


def _dense(lengths: np.ndarray, levels: np.ndarray, times: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Every candidate evaluated: the first time at or below each level, (m, q)."""
    out = np.full((levels.size, lengths.size), np.inf)
    for j, n in enumerate(lengths.tolist()):
        for i, level in enumerate(levels.tolist()):
            hits = np.flatnonzero(exact[j, :n] <= level)
            if hits.size:
                out[i, j] = times[j, hits[0]]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_search_finds_the_first_crossing_of_a_non_monotone_function(seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, n = 40, 700
    lengths = rng.integers(0, n + 1, q)
    times = np.sort(rng.uniform(0, 10, (q, n)), axis=1)
    bound = np.sort(rng.uniform(0, 1, (q, n)), axis=1)[:, ::-1]  # non-increasing along each row
    # the exact values: the bound plus a bump that is zero or not (not monotone)
    exact = bound + np.where(rng.random((q, n)) < 0.7, rng.uniform(0, 0.3, (q, n)), 0.0)
    levels = np.array([0.3, 0.1, 0.01])

    def at(table: np.ndarray) -> _tail_search.Evaluate:
        return lambda rows, pos: table[rows[:, None], pos]

    got = first_at_or_below(lengths, levels, at(times), at(bound), at(exact))
    assert np.array_equal(got, _dense(lengths, levels, times, exact))


@pytest.mark.parametrize("seed", range(4))
def test_predicted_quantiles_are_those_of_every_candidate_evaluated(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound's search skips only candidates that cannot qualify: the quantiles equal, to the
    bit, those of one exact round over every candidate (``DENSE_LIMIT`` above every list), with
    the bucket replayed (not monotone), with censoring, on a 96-point grid."""
    rng = np.random.default_rng(seed)
    n = 1500
    primary_s = rng.lognormal(np.log(0.3), 0.8, n)
    censored = rng.random(n) < 0.1
    primary = km_survival(primary_s, censored)
    backup = km_survival(rng.lognormal(np.log(0.3), 0.8, 300), rng.random(300) < 0.3)
    grid = np.geomspace(0.6, 4.0, 96)
    levels = (0.9, 0.99, 0.995)
    for burst in (1.0, 10.0):  # a bucket that runs dry often, and one that rarely does
        replay = BucketReplay(primary_s, censored, budget=0.05, burst=burst)
        for bucket in (None, replay):
            monkeypatch.setattr(_tail_search, "DENSE_LIMIT", 0)
            searched = predicted_quantile_levels(primary, backup, grid, levels, bucket)
            monkeypatch.setattr(_tail_search, "DENSE_LIMIT", 10**9)
            dense = predicted_quantile_levels(primary, backup, grid, levels, bucket)
            assert np.isfinite(dense).any()
            assert np.array_equal(searched, dense)
