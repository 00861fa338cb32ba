"""Tests of the drift detection (``_policy_drift``: ``detect_change``, log-rank; ``detect_tail_recovery``)."""

from __future__ import annotations

import numpy as np
import pytest

from hedgerow.controller.policy._policy_drift import DEFAULT_SPLITS_S, MIN_SINCE_S, detect_change, detect_tail_recovery


def window(minutes_slow: float, *, factor: float = 2.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """3 calls/s over 52 minutes, lognormal TTFT (median 0.6 s, sigma 0.5); the last
    ``minutes_slow`` minutes have every TTFT multiplied by ``factor``."""
    rng = np.random.default_rng(seed)
    n = 3 * 52 * 60
    age = np.sort(rng.uniform(0, 52 * 60, n))[::-1]
    ttft = 0.6 * np.exp(0.5 * rng.standard_normal(n))
    ttft[age < minutes_slow * 60] *= factor
    return age, ttft, np.zeros(n, dtype=bool)


def test_worked_number_in_module_docstring() -> None:
    age, ttft, censored = window(2.0)
    change = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50)
    assert change is not None and change.since_s == 120.0
    assert change.statistic == pytest.approx(22.31, abs=0.01) and change.median_ratio == pytest.approx(2.143, abs=1e-3)
    assert change.recent_samples == int((age < 120).sum()) == 347


def test_no_change_is_no_alarm() -> None:
    for seed in range(5):
        age, ttft, censored = window(0.0, seed=seed)
        assert detect_change(age, ttft, censored, window_s=3600.0, min_samples=50) is None


def test_a_small_shift_is_not_material() -> None:
    # 10% slower for the last 20 minutes: the log-rank test sees it (9,000 samples) but the
    # medians differ by less than 1.75x, so the window is kept
    age, ttft, censored = window(20.0, factor=1.1)
    assert detect_change(age, ttft, censored, window_s=3600.0, min_samples=50) is None
    found = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50, min_ratio=1.05)
    assert found is not None and abs(found.since_s - 1200.0) <= 60.0


def test_a_recovery_is_found_too() -> None:
    age, ttft, censored = window(30.0, factor=0.5)
    change = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50)
    assert change is not None and abs(change.since_s - 1800.0) <= 60.0 and change.median_ratio < 0.8


@pytest.mark.parametrize(("minutes", "factor"), [(45.0, 0.5), (45.0, 2.0), (27.0, 0.5), (10.0, 2.0)])
def test_the_change_point_is_located_on_a_one_minute_grid(minutes: float, factor: float) -> None:
    """The coarse splits alone put a change 45 minutes ago at 50 minutes (3000 s), so the
    window since the change held 5 minutes of the old regime (bench/controller_eval.py,
    slowdown_2x_and_back seed 1: the threshold moved 8 times an hour after the recovery as the
    window stepped from split to split). Between the passing split's neighbours the largest
    log-rank statistic on a 60 s grid is at the true change."""
    for seed in range(3):
        age, ttft, censored = window(minutes, factor=factor, seed=seed)
        change = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50)
        assert change is not None and change.since_s == minutes * 60.0, (seed, change)
        coarse = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50, refine_step_s=0)
        assert coarse is not None and coarse.since_s in DEFAULT_SPLITS_S


def test_the_window_since_a_change_is_never_shorter_than_two_minutes() -> None:
    # a change 1 minute ago: the 2-minute split passes (half of it is the new regime) and the
    # refinement does not go below 2 minutes of data
    age, ttft, censored = window(1.0, factor=3.0)
    change = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50, splits_s=(120.0, 180.0))
    assert change is not None and change.since_s == MIN_SINCE_S == 120.0


def test_censored_samples_are_handled() -> None:
    age, ttft, _ = window(5.0)
    censored = ttft > 1.5  # hedged and cancelled at their time
    change = detect_change(age, np.minimum(ttft, 1.5), censored, window_s=3600.0, min_samples=50)
    assert change is not None and abs(change.since_s - 300.0) <= 60.0


def test_too_few_samples_on_either_side_tries_nothing() -> None:
    age, ttft, censored = window(2.0)
    assert detect_change(age, ttft, censored, window_s=3600.0, min_samples=10**6) is None
    assert detect_change(age, ttft, censored, window_s=50.0, min_samples=50) is None  # no split < window
    assert min(DEFAULT_SPLITS_S) == 120.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"alpha": 0.0}, "alpha"), ({"alpha": 1.0}, "alpha"), ({"min_ratio": 0.5}, "min_ratio")],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, float], name: str) -> None:
    age, ttft, censored = window(0.0)
    with pytest.raises(ValueError, match=name):
        detect_change(age, ttft, censored, window_s=3600.0, min_samples=50, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        detect_change(age[:-1], ttft, censored, window_s=3600.0, min_samples=50)


def test_the_last_minutes_of_an_old_regime_are_shed() -> None:
    """A slowdown that ended 57 minutes ago leaves 3 slow minutes at the old end of a 1-hour
    window. With 55 minutes as the longest split they were mixed with 2 minutes of the new
    regime, the medians differed by less than 1.75x and the full hour was used, slow minutes
    included (slowdown_2x_and_back seeds 3 and 5: 4 threshold changes an hour)."""
    rng = np.random.default_rng(9)
    age = np.sort(rng.uniform(0, 3600, 3 * 3600))[::-1]
    ttft = 0.6 * np.exp(0.5 * rng.standard_normal(age.size))
    ttft[age >= 57 * 60] *= 2.0
    censored = np.zeros(age.size, dtype=bool)
    change = detect_change(age, ttft, censored, window_s=3600.0, min_samples=50)
    assert change is not None and change.since_s == 57 * 60.0 and change.median_ratio < 0.6
    old_splits = tuple(s for s in DEFAULT_SPLITS_S if s <= 3300.0)
    assert detect_change(age, ttft, censored, window_s=3600.0, min_samples=50, splits_s=old_splits) is None


def transient(ended_min: float, *, seed: int = 0, share: float = 0.1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """3 calls/s over 52 minutes, lognormal TTFT (median 0.6 s, sigma 0.5); in the 7 minutes
    that ended ``ended_min`` minutes ago, a random ``share`` of the calls is 8x slower (a queue
    on one replica: the tail moves, the median does not)."""
    rng = np.random.default_rng(seed)
    n = 3 * 52 * 60
    age = np.sort(rng.uniform(0, 52 * 60, n))[::-1]
    ttft = 0.6 * np.exp(0.5 * rng.standard_normal(n))
    inside = (age >= ended_min * 60) & (age < (ended_min + 7) * 60)
    ttft[inside & (rng.random(n) < share)] *= 8.0
    return age, ttft, np.zeros(n, dtype=bool)


def test_tail_recovery_worked_number_in_module_docstring() -> None:
    age, ttft, censored = transient(12.0)
    assert detect_change(age, ttft, censored, window_s=3600.0, min_samples=50) is None  # medians alike
    change = detect_tail_recovery(age, ttft, censored, window_s=3600.0, min_samples=50)
    assert change is not None and change.since_s == 720.0
    assert change.recent_samples == int((age < 720).sum()) == 2184
    assert (change.recent_over, change.recent_known, change.older_over) == (0, 2184, 71)
    assert change.older_over / change.older_known == pytest.approx(0.0099, abs=1e-4)
    assert change.level_s == pytest.approx(4.37, abs=0.01) and change.p_value == pytest.approx(5.9e-9, rel=0.02)


def test_tail_recovery_is_one_sided_and_quiet_without_a_transient() -> None:
    for seed in range(5):
        assert detect_tail_recovery(*transient(0.0, seed=seed, share=0.0), window_s=3600.0, min_samples=50) is None
        # a transient under way (the recent tail heavier) is no recovery
        assert detect_tail_recovery(*transient(0.0, seed=seed), window_s=3600.0, min_samples=50) is None


def test_tail_recovery_leaves_the_transient_out() -> None:
    for ended in (8.0, 20.0, 40.0):
        for seed in range(3):
            age, ttft, censored = transient(ended, seed=seed)
            change = detect_tail_recovery(age, ttft, censored, window_s=3600.0, min_samples=50)
            assert change is not None and MIN_SINCE_S <= change.since_s <= ended * 60.0, (ended, seed, change)
    with pytest.raises(ValueError, match="shape"):
        detect_tail_recovery(age[:-1], ttft, censored, window_s=3600.0, min_samples=50)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"alpha": 0.0}, "alpha"), ({"min_ratio": 0.5}, "min_ratio"), ({"q": 1.0}, "q must")],
)
def test_tail_recovery_bad_arguments_name_themselves(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        detect_tail_recovery(*transient(12.0), window_s=3600.0, min_samples=50, **kwargs)  # type: ignore[arg-type]


def test_tail_split_counts_follow_the_known_over_rule() -> None:
    """The tail comparison counts each part at the distinct durations (``_exceedances``); it
    must agree with ``_policy_rules.known_over_counts`` at every level, ties and censoring
    times equal to the level included."""
    from hedgerow.controller.policy._policy_drift import _exceedances
    from hedgerow.controller.policy._policy_rules import known_over_counts

    rng = np.random.default_rng(3)
    durations = rng.choice(np.arange(0.1, 3.0, 0.1).round(1), 400)  # many ties
    censored = rng.random(400) < 0.3
    weights = rng.integers(1, 4, 400).astype(float)
    times = np.unique(durations)
    at_time = np.searchsorted(times, durations)
    weight = np.bincount(at_time, weights=weights, minlength=times.size)
    died = np.bincount(at_time, weights=weights * ~censored, minlength=times.size)
    over, known = known_over_counts(durations, censored, times, weights)
    for at in range(times.size):
        assert _exceedances(weight, died, at) == (int(over[at]), int(known[at]))
