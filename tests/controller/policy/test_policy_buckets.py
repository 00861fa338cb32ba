"""The objective's predictions: KM steps spread over their buckets (minute aggregates) and gaps (sparse samples)."""

from __future__ import annotations

import numpy as np
import pytest

from hedgerow.controller.policy._policy_rules import spread_steps
from hedgerow.controller.policy.hedge_model import SurvivalCurve, km_survival, predicted_quantiles
from hedgerow.controller.policy.ttft_histogram import BUCKET_ENDS_S as ENDS
from hedgerow.controller.policy.ttft_histogram import BUCKET_RATIO, bucket_indices


def test_a_step_at_a_bucket_end_is_spread_over_its_bucket() -> None:
    # the docstring's worked number: one step at the 0.5012 s end from 1 to 0.5 becomes 8
    # steps of 0.0625, log-spaced over (0.5012 / 1.047, 0.5012]; S(0.49 s) is 0.75, not 1
    end = float(ENDS[bucket_indices(np.array([0.5]))[0]])
    assert end == pytest.approx(0.50119, abs=1e-5)
    spread = spread_steps(SurvivalCurve(np.array([end]), np.array([0.5]), 10))
    assert spread.times_s.size == 8 and spread.times_s[-1] == end
    assert spread.times_s[0] == pytest.approx(end / BUCKET_RATIO * BUCKET_RATIO ** (1 / 8))
    assert np.allclose(np.diff(spread.values), -0.0625)
    assert float(spread(0.49)) == 0.75 and float(spread(end)) == 0.5 and float(spread(0.47)) == 1.0


def test_a_curve_of_raw_durations_is_kept_as_is() -> None:
    curve = SurvivalCurve(np.array([0.5, ENDS[170]]), np.array([0.6, 0.2]), 10)  # 0.5 s is no bucket end
    assert spread_steps(curve) is curve


def test_a_curve_with_a_duration_in_the_first_bucket_is_spread_too() -> None:
    # the first bucket (durations up to 1 ms) ends at MIN_S; it used to fail the bucket-end
    # check, so one sub-millisecond TTFT left the whole window's curve unspread
    assert float(ENDS[0]) == 0.001
    curve = SurvivalCurve(np.array([float(ENDS[0]), float(ENDS[170])]), np.array([0.9, 0.2]), 10)
    spread = spread_steps(curve)
    assert spread is not curve and spread.times_s[-1] == float(ENDS[170])


def test_a_gap_between_occupied_buckets_is_interpolated_log_linearly() -> None:
    # the docstring's worked number: steps at the 1.0 s end (to 0.8) and the 1.9953 s end 15
    # buckets up (to 0.4); the second becomes 15 * 8 = 120 sub-steps over (1.0, 1.9953], so
    # S(1.413 s) = 0.6 (read at bucket ends, or spread only within the buckets: 0.8)
    low, high = float(ENDS[150]), float(ENDS[165])
    assert (low, round(high, 4)) == (1.0, 1.9953)
    spread = spread_steps(SurvivalCurve(np.array([low, high]), np.array([0.8, 0.4]), 10))
    assert spread.times_s.size == 8 + 120 and spread.times_s[-1] == high
    assert float(spread(1.413)) == pytest.approx(0.6, abs=1e-12)
    assert float(spread(low)) == pytest.approx(0.8) and float(spread(high)) == pytest.approx(0.4)
    assert float(spread(0.99)) < 1.0  # the first step is spread over its own bucket


def test_predicted_tails_on_the_buckets_come_within_a_percent_of_the_calls() -> None:
    # 20,000 lognormal primaries and backups (median 0.5 s, sigma 0.3), the predicted call P99
    # at 25 thresholds of 0.6-1.2 s: read at their buckets' ends the durations predict tails up
    # to 4.5% off the raw ones, in 4.7% jumps (a 2% tolerance cannot tell them apart); spread
    # over their buckets, within 0.8%
    rng = np.random.default_rng(1)
    primary, backup = rng.lognormal(np.log(0.5), 0.3, 20_000), rng.lognormal(np.log(0.5), 0.3, 20_000)
    flags = np.zeros(primary.size, dtype=bool)
    thresholds = np.geomspace(0.6, 1.2, 25)
    raw = predicted_quantiles(km_survival(primary, flags), km_survival(backup, flags), thresholds)
    s_b = km_survival(ENDS[bucket_indices(primary)], flags)
    g_b = km_survival(ENDS[bucket_indices(backup)], flags)
    stepped = predicted_quantiles(s_b, g_b, thresholds)
    spread = predicted_quantiles(spread_steps(s_b), spread_steps(g_b), thresholds)
    assert np.max(np.abs(stepped / raw - 1)) > 0.04
    assert np.max(np.abs(spread / raw - 1)) < 0.01
