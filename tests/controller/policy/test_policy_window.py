"""Tests of the window rules (``_policy_window``): the sample rule, widening, drift shrink, counts."""

from __future__ import annotations

import numpy as np
import pytest

from hedgerow.controller.policy._policy_window import (
    TAIL_SAMPLES,
    CallCounts,
    Samples,
    WindowData,
    WindowRecords,
    _latest_in_order,
    observe_window,
    ttft_sample,
)
from hedgerow.controller.policy.policy import PolicyKnobs
from hedgerow.settings import Settings


def test_ttft_sample_rule() -> None:
    assert ttft_sample(0.0, 0.8, 3.0, "won") == (0.8, False)
    assert ttft_sample(1.0, None, 1.6, "cancelled") == pytest.approx((0.6, True))
    assert ttft_sample(0.0, None, 0.1, "failed") is None  # fast failures are not samples


def make(age: np.ndarray, primary: np.ndarray, **kw: np.ndarray) -> WindowRecords:
    n = age.size
    no = np.zeros(n, dtype=bool)
    fields = {
        "primary_censored": no,
        "hedged": no,
        "backup_won": no,
        "denied": no,
        "backup_s": np.full(n, np.nan),
        "backup_censored": no,
        "call_ttft_s": primary,
    } | kw
    return WindowRecords(age_s=age, primary_s=primary, **fields)


def observe(recs: WindowRecords, settings: Settings | None = None):  # type: ignore[no-untyped-def]
    settings = settings or Settings()
    return observe_window(recs, settings=settings, budget=0.10, knobs=PolicyKnobs.from_settings(settings))


def test_window_doubles_while_samples_are_too_few() -> None:
    age = np.linspace(3 * 3600, 2.5 * 3600, 80)  # 2.5-3 hours old
    settings = Settings()
    obs = observe_window(make(age, np.full(80, 0.3)), settings=settings, budget=None, knobs=PolicyKnobs())
    assert obs.window_s == 4 * 3600 and obs.estimate is not None and obs.estimate.samples == 80


def test_window_widens_until_the_budget_tail_holds_enough_samples() -> None:
    """small_windows (bench/controller_eval.py --suite scenarios, 3 calls/min): a 1-hour window
    of ~180 primaries expects 18 beyond the 10% budget quantile, and its budget target moved
    4.1-5.8 s between one-minute ticks, so the threshold changed 2-6 times an hour. The window
    now widens until ``samples * budget >= TAIL_SAMPLES`` (300 samples at 10%)."""
    rng = np.random.default_rng(3)
    age = np.sort(rng.uniform(0, 3 * 3600, 540))[::-1]  # 3 calls/min for 3 hours
    primary = np.exp(rng.standard_normal(540))
    obs = observe(make(age, primary))
    assert TAIL_SAMPLES == 30
    assert obs.window_s == 2 * 3600 and obs.estimate is not None
    assert obs.estimate.samples == int((age < 7200).sum()) >= 300
    wide = observe_window(make(age, primary), settings=Settings(), budget=0.5, knobs=PolicyKnobs())
    assert wide.window_s == 3600  # 180 samples expect 90 beyond a 50% budget's quantile


def test_counts_of_the_window_and_the_short_window() -> None:
    age = np.linspace(3500, 1, 1000)
    primary = np.linspace(0.1, 2.0, 1000)
    hedged = primary > 1.5
    won = hedged & (np.arange(1000) % 2 == 0)
    denied = np.arange(1000) % 97 == 0
    backup = np.where(hedged, 0.2, np.nan)
    ttft = np.where(np.arange(1000) % 50 == 0, np.nan, primary)  # some failed calls
    obs = observe(
        make(age, primary, hedged=hedged, backup_won=won, denied=denied, backup_s=backup, call_ttft_s=ttft),
        Settings(drift_alpha=0.0),
    )
    assert obs.calls == 1000 and obs.hedges == int(hedged.sum())
    assert obs.backup_win_rate == pytest.approx(won.sum() / hedged.sum())
    assert obs.wanted_hedge_rate == pytest.approx((hedged | denied).sum() / 1000)
    short = age < 300
    assert obs.short_window_calls == int(short.sum()) and len(obs.short_durations_s) == int(short.sum())
    assert obs.call_ttft_samples == int(np.count_nonzero(~np.isnan(ttft)))
    assert obs.backup_curve is not None and obs.backup_curve.samples == int(hedged.sum())
    # the primary samples go to the policy in arrival order (oldest first)
    assert obs.primary_started_s == tuple(sorted(obs.primary_started_s))


def test_a_change_shrinks_the_window_to_the_data_since_it() -> None:
    rng = np.random.default_rng(3)
    age = np.sort(rng.uniform(0, 3500, 10_000))[::-1]
    primary = 0.6 * np.exp(0.5 * rng.standard_normal(10_000))
    primary[age < 480] *= 2.0
    obs = observe(make(age, primary))
    assert obs.drift is not None and obs.window_s == 480.0 == obs.drift["since_s"]
    assert obs.estimate is not None and obs.estimate.samples == int((age < 480).sum())
    off = observe(make(age, primary), Settings(drift_alpha=0.0))
    assert off.drift is None and off.window_s == 3600.0


def test_records_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="primary_s"):
        WindowRecords(
            age_s=np.zeros(3),
            primary_s=np.zeros(2),
            primary_censored=np.zeros(3, dtype=bool),
            hedged=np.zeros(3, dtype=bool),
            backup_won=np.zeros(3, dtype=bool),
            denied=np.zeros(3, dtype=bool),
            backup_s=np.zeros(3),
            backup_censored=np.zeros(3, dtype=bool),
            call_ttft_s=np.zeros(3),
        )
    assert WindowRecords.from_rows([]).age_s.size == 0


def test_a_recovered_tail_shrinks_the_window_to_the_data_since_it() -> None:
    """A 7-minute queue that ended 12 minutes ago made 10% of its calls 8x slower: the median
    test sees no change (medians alike), the tail test does, and the window holds only the
    12 minutes since (``_policy_drift.detect_tail_recovery``)."""
    rng = np.random.default_rng(0)
    n = 3 * 52 * 60
    age = np.sort(rng.uniform(0, 52 * 60, n))[::-1]
    primary = 0.6 * np.exp(0.5 * rng.standard_normal(n))
    queue = (age >= 720) & (age < 1140)
    primary[queue & (rng.random(n) < 0.1)] *= 8.0
    obs = observe(make(age, primary))
    assert obs.drift is not None and obs.drift["test"] == "tail" and obs.window_s == 720.0 == obs.drift["since_s"]
    assert obs.drift["recent_over"] == 0 and not obs.drift["fresh"]
    assert obs.estimate is not None and obs.estimate.samples == int((age < 720).sum())
    calm = primary.copy()
    calm[queue] = 0.6 * np.exp(0.5 * rng.standard_normal(int(queue.sum())))
    assert observe(make(age, calm)).drift is None


def _grouped(records: WindowRecords) -> WindowData:
    """The records as weighted entries: one per distinct (age, duration, censored) of each kind,
    one counter entry per distinct age (what a histogram per minute and bucket holds)."""

    def samples(age: np.ndarray, durations: np.ndarray, censored: np.ndarray) -> Samples:
        keys, counts = np.unique(np.column_stack((age, durations, censored)), axis=0, return_counts=True)
        return Samples(keys[:, 0], keys[:, 1], keys[:, 2].astype(bool), counts)

    data = records.data()
    c = data.counts
    ages, inverse = np.unique(c.age_s, return_inverse=True)

    def per_age(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values.astype(float), minlength=ages.size)

    return WindowData(
        primary=samples(data.primary.age_s, data.primary.durations_s, data.primary.censored),
        backup=samples(data.backup.age_s, data.backup.durations_s, data.backup.censored),
        call_ttft=samples(data.call_ttft.age_s, data.call_ttft.durations_s, data.call_ttft.censored),
        counts=CallCounts(
            ages, per_age(c.calls), per_age(c.hedged), per_age(c.backup_wins), per_age(c.denied), per_age(c.wanted)
        ),
    )


@pytest.mark.parametrize("shift", [1.0, 2.5], ids=["steady", "slowdown"])
def test_weighted_entries_observe_what_their_calls_do(shift: float) -> None:
    """Calls on a 60 s grid with durations on a 0.05 s grid, given once per call and once as
    (minute, duration, count) entries: the same observation (the window rules read weights)."""
    rng = np.random.default_rng(3)
    n = 6000
    age = np.floor(rng.uniform(0, 3600, n) / 60) * 60 + 30
    primary = np.round(rng.lognormal(np.log(0.5), 0.6, n), 2)
    primary[age < 600] *= shift  # the last 10 minutes slower: the log-rank test cuts there
    primary = np.round(primary / 0.05) * 0.05 + 0.05
    hedged = primary > 1.0
    backup = np.where(hedged, np.round(rng.lognormal(np.log(0.4), 0.5, n), 1) + 0.1, np.nan)
    won = hedged & (backup + 1.0 < primary)
    censored = won  # the primaries the backup beat were cancelled at its first token
    primary = np.where(won, np.round(backup + 1.0, 2), primary)
    records = make(
        age[::-1].copy(),
        primary[::-1].copy(),
        primary_censored=censored[::-1].copy(),
        hedged=hedged[::-1].copy(),
        backup_won=won[::-1].copy(),
        backup_s=backup[::-1].copy(),
        backup_censored=(hedged & ~won)[::-1].copy(),
        call_ttft_s=np.minimum(primary, np.where(hedged, backup + 1.0, np.inf))[::-1].copy(),
    )
    # every call in the replay arrays: which calls are the latest 1,000 differs between the two
    # forms (a minute's entries have no order), so the arrays are compared whole
    settings = Settings(replay_max_calls=n)
    one = observe(records, settings)
    weighted = observe_window(
        _grouped(records), settings=settings, budget=0.10, knobs=PolicyKnobs.from_settings(settings)
    )
    assert (one.drift is not None) == (shift > 1.0)
    assert weighted.estimate is not None and one.estimate is not None
    for name in ("samples", "censored", "p50_s", "p90_s", "p99_s", "target_s", "target_all_events_s"):
        assert getattr(weighted.estimate, name) == getattr(one.estimate, name), name
    for name in (
        "window_s", "calls", "hedges", "observed_hedge_rate", "backup_win_rate", "short_window_calls",
        "short_window_hedge_rate", "call_ttft_samples", "call_p99_s", "short_window_target_s",
        "wanted_hedge_rate", "drift",
    ):  # fmt: skip
        assert getattr(weighted, name) == getattr(one, name), name
    for name in ("primary_durations_s", "short_durations_s", "backup_durations_s"):
        assert sorted(getattr(weighted, name)) == sorted(getattr(one, name)), name
    assert weighted.backup_curve is not None and one.backup_curve is not None
    assert np.array_equal(weighted.backup_curve.values, one.backup_curve.values)


def test_the_replay_arrays_hold_the_latest_calls_in_arrival_order() -> None:
    """``replay_max_calls`` bounds rules 2 and 3's arrays to the window's latest calls, oldest
    first; with weighted entries a minute's calls are spread, not sorted by duration."""
    age = np.arange(3000, 0, -1.0)  # oldest first, one call a second
    obs = observe(make(age, age / 1000.0), Settings(replay_max_calls=500, drift_alpha=0.0))
    assert len(obs.primary_durations_s) == 500
    assert obs.primary_started_s == tuple((-age[-500:]).tolist())
    assert obs.primary_durations_s == tuple((age[-500:] / 1000.0).tolist())
    minute = WindowData(
        primary=Samples(np.full(100, 30.0), np.arange(1, 101) / 10.0, np.zeros(100, bool), np.ones(100) * 2),
        backup=Samples(np.empty(0), np.empty(0), np.empty(0, bool), np.empty(0)),
        call_ttft=Samples(np.empty(0), np.empty(0), np.empty(0, bool), np.empty(0)),
        counts=CallCounts(np.array([30.0]), np.array([200]), *(np.zeros(1),) * 4),
    )
    spread = observe_window(
        minute, settings=Settings(replay_max_calls=150), budget=0.10, knobs=PolicyKnobs(replay_max_calls=150)
    )
    durations = np.asarray(spread.primary_durations_s)
    assert durations.size == 150 and sorted(durations) != list(durations)
    # the first and last 50 of a sorted order would be 0.1-2.5 s and 7.6-10 s
    assert 2.0 < durations[:50].mean() < 8.0 and 2.0 < durations[-50:].mean() < 8.0


def test_the_replay_arrays_are_those_of_sorting_every_call() -> None:
    """Expanding only the youngest entries gives what expanding and sorting every masked call
    does: the same calls, the same order, each call keeping its pseudo-random key (seed 0)."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 60))
        age = rng.choice(np.arange(0.0, 3600.0, 60.0) + 30.0, n)  # minute middles, repeated
        age = np.concatenate((age, rng.uniform(0.0, 120.0, int(rng.integers(0, 20)))))  # recent calls
        weights = rng.integers(1, 20, age.size).astype(float) if trial % 4 else np.ones(age.size)
        primary = Samples(age, rng.exponential(1.0, age.size), rng.random(age.size) < 0.2, weights)
        mask = rng.random(age.size) < 0.9
        limit = int(rng.integers(1, 400))
        durations, censored, ages = primary.expanded(np.flatnonzero(mask))
        if primary.weights_of(mask) is None:
            order = np.argsort(-ages, kind="stable")[-limit:]
        else:
            order = np.lexsort((np.random.default_rng(0).random(ages.size), -ages))[-limit:]
        got = _latest_in_order(primary, mask, limit)
        for have, want in zip(got, (durations[order], censored[order], ages[order]), strict=True):
            assert np.array_equal(have, want), trial
