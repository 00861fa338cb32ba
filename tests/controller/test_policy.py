"""Tests of the controller's budget policy (``decide``): every rule and reason code."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from hedgerow.controller.estimation import TTFTEstimate, estimate_ttft
from hedgerow.controller.policy import (
    REASON_CODES,
    SHORT_WINDOW_MIN_CALLS,
    Decision,
    Observation,
    PolicyKnobs,
    RouteConfig,
    decide,
)
from hedgerow.settings import Settings

CONFIG = RouteConfig()  # budget 0.10, default 2.0 s, bounds 0.05 s .. 30 s
KNOBS = PolicyKnobs()  # min_samples 50, hysteresis 0.05, step down 0.25, step up 1.0


def estimate(
    target_s: float | None,
    *,
    samples: int = 500,
    budget: float = 0.10,
    all_events_s: float | None = 2.5,
    max_censored_s: float = 3.0,
) -> TTFTEstimate:
    """An estimate with a given target (the quantiles are irrelevant to the policy).

    With ``target_s=None`` the default is a censored budget quantile (the all-events target
    ``all_events_s`` exists); ``all_events_s=None`` makes it a sample-size problem."""
    return TTFTEstimate(
        samples=samples,
        censored=samples // 10,
        p50_s=0.4,
        p75_s=0.6,
        p90_s=0.8,
        p95_s=1.0,
        p99_s=None,
        max_observed_s=max(3.0, max_censored_s),
        budget=budget,
        target_s=target_s,
        target_all_events_s=all_events_s if target_s is None else None,
        max_censored_s=max_censored_s,
    )


def observe(
    est: TTFTEstimate | None,
    *,
    short_calls: int = 0,
    short_rate: float | None = None,
    hedges: int = 0,
    backup_win_rate: float | None = None,
) -> Observation:
    """An observation over one hour with the given short-window and hedge figures."""
    return Observation(
        estimate=est,
        window_s=3600.0,
        calls=1000,
        observed_hedge_rate=0.08,
        backup_win_rate=backup_win_rate,
        hedges=hedges,
        short_window_calls=short_calls,
        short_window_hedge_rate=short_rate,
    )


def codes(decision: Decision) -> list[str]:
    """The decision's reason codes, each checked against the documented set."""
    parts = decision.reason.split(",")
    assert set(parts) <= REASON_CODES, parts
    return parts


# --- rule 1: disabled / pinned -------------------------------------------------------------


def test_disabled_keeps_current_value() -> None:
    d = decide(RouteConfig(enabled=False), 1.7, observe(estimate(0.5)), KNOBS)
    assert d == Decision(hedge_after_s=1.7, applied=False, reason="disabled", source="disabled")


def test_disabled_without_a_value_publishes_the_default() -> None:
    d = decide(RouteConfig(enabled=False), None, observe(None), KNOBS)
    assert d == Decision(hedge_after_s=2.0, applied=True, reason="disabled", source="disabled")


def test_pinned_value_is_published_as_is() -> None:
    config = RouteConfig(pinned_hedge_after_s=45.0)  # above max: pinned is not clamped
    d = decide(config, 1.0, observe(estimate(0.5)), KNOBS)
    assert d == Decision(hedge_after_s=45.0, applied=True, reason="pinned", source="pinned")
    again = decide(config, 45.0, observe(estimate(0.5)), KNOBS)
    assert again.applied is False and again.hedge_after_s == 45.0


# --- rule 2: too few samples ---------------------------------------------------------------


def test_no_samples_publishes_the_default_first() -> None:
    d = decide(CONFIG, None, observe(None), KNOBS)
    assert d == Decision(2.0, True, "too_few_samples", "default")


def test_too_few_samples_keeps_current() -> None:
    d = decide(CONFIG, 1.2, observe(estimate(0.5, samples=49)), KNOBS)
    assert d == Decision(1.2, False, "too_few_samples", "controller")
    enough = decide(CONFIG, 1.2, observe(estimate(0.5, samples=50)), KNOBS)
    assert codes(enough)[0] == "target"


# --- rule 3: censored raise ----------------------------------------------------------------


def test_censored_target_raises_by_a_bounded_step() -> None:
    d = decide(CONFIG, 1.5, observe(estimate(None)), KNOBS)
    assert d == Decision(3.0, True, "censored_raise", "controller")
    half = decide(CONFIG, 1.5, observe(estimate(None)), dataclasses.replace(KNOBS, max_step_up=0.5))
    assert half.hedge_after_s == pytest.approx(2.25)


def test_censored_raise_from_real_censored_data() -> None:
    # Hedging at 0.8 s with a fast backup censors every primary slower than ~0.8 s; P90 is
    # hidden, so the estimator gives no target and the policy raises.
    x = stats.lognorm(s=0.6).rvs(1000, random_state=np.random.default_rng(2))
    cut = 0.8 + 0.05
    est = estimate_ttft(np.minimum(x, cut), x > cut, budget=0.10)
    assert est.target_s is None
    d = decide(CONFIG, 0.8, observe(est), KNOBS)
    assert (d.hedge_after_s, d.reason, d.applied) == (1.6, "censored_raise", True)


# --- rule 4: raise fast when over budget ---------------------------------------------------


def test_raise_over_budget_moves_up_at_once() -> None:
    obs = observe(estimate(4.0), short_calls=200, short_rate=0.14)
    d = decide(CONFIG, 1.0, obs, KNOBS)
    assert d == Decision(4.0, True, "raise_over_budget", "controller")


def test_target_above_current_without_over_budget_is_also_taken() -> None:
    d = decide(CONFIG, 1.0, observe(estimate(4.0), short_calls=200, short_rate=0.05), KNOBS)
    assert d == Decision(4.0, True, "target", "controller")


def test_over_budget_holds_a_lower_target() -> None:
    d = decide(CONFIG, 1.0, observe(estimate(0.5), short_calls=200, short_rate=0.14), KNOBS)
    assert d == Decision(1.0, False, "over_budget_hold", "controller")


def test_short_window_needs_enough_calls() -> None:
    few = observe(estimate(0.5), short_calls=SHORT_WINDOW_MIN_CALLS - 1, short_rate=0.5)
    d = decide(CONFIG, 1.0, few, KNOBS)
    assert codes(d) == ["target", "step_down_limited"]  # the short window is ignored
    enough = observe(estimate(0.5), short_calls=SHORT_WINDOW_MIN_CALLS, short_rate=0.5)
    assert decide(CONFIG, 1.0, enough, KNOBS).reason == "over_budget_hold"


# --- rule 5: lower slowly ------------------------------------------------------------------


def test_step_down_is_limited_per_tick() -> None:
    d = decide(CONFIG, 2.0, observe(estimate(0.9)), KNOBS)
    assert d == Decision(1.5, True, "target,step_down_limited", "controller")


def test_small_decrease_goes_straight_to_target() -> None:
    d = decide(CONFIG, 2.0, observe(estimate(1.6)), KNOBS)
    assert d == Decision(1.6, True, "target", "controller")


def test_worked_number_in_module_docstring() -> None:
    current = 2.0
    steps = []
    for target in (0.9, 0.9, 0.9, 0.93):
        d = decide(CONFIG, current, observe(estimate(target)), KNOBS)
        steps.append((round(d.hedge_after_s, 6), d.reason))
        current = d.hedge_after_s
    assert steps == [
        (1.5, "target,step_down_limited"),
        (1.125, "target,step_down_limited"),
        (0.9, "target"),
        (0.9, "hysteresis_hold"),
    ]
    up = decide(CONFIG, current, observe(estimate(1.3), short_calls=200, short_rate=0.14), KNOBS)
    assert (up.hedge_after_s, up.reason) == (1.3, "raise_over_budget")


# --- rule 6: hysteresis --------------------------------------------------------------------


@pytest.mark.parametrize("target", [0.96, 1.04])
def test_small_changes_are_held(target: float) -> None:
    d = decide(CONFIG, 1.0, observe(estimate(target)), KNOBS)
    assert d == Decision(1.0, False, "hysteresis_hold", "controller")


def test_change_at_hysteresis_is_applied() -> None:
    d = decide(CONFIG, 1.0, observe(estimate(1.06)), KNOBS)
    assert (d.hedge_after_s, d.applied, d.reason) == (1.06, True, "target")


def test_first_publication_skips_hysteresis() -> None:
    d = decide(CONFIG, None, observe(estimate(1.98)), KNOBS)
    assert d == Decision(1.98, True, "target", "controller")


def test_zero_hysteresis_follows_every_change() -> None:
    knobs = dataclasses.replace(KNOBS, hysteresis=0.0)
    d = decide(CONFIG, 1.0, observe(estimate(1.01)), knobs)
    assert (d.hedge_after_s, d.reason) == (1.01, "target")


# --- rule 7: clamps ------------------------------------------------------------------------


def test_clamped_to_max() -> None:
    d = decide(CONFIG, 10.0, observe(estimate(50.0)), KNOBS)
    assert d == Decision(30.0, True, "target,clamped_max", "controller")
    at_max = decide(CONFIG, 30.0, observe(estimate(None, max_censored_s=40.0)), KNOBS)
    assert at_max == Decision(30.0, False, "censored_raise,clamped_max", "controller")


def test_clamped_to_min() -> None:
    config = RouteConfig(min_hedge_after_s=0.5)
    d = decide(config, 0.55, observe(estimate(0.45)), KNOBS)
    assert d == Decision(0.5, True, "target,clamped_min", "controller")
    both = decide(config, 0.6, observe(estimate(0.2)), KNOBS)  # step floor 0.45, then min
    assert both == Decision(0.5, True, "target,step_down_limited,clamped_min", "controller")


def test_tightened_bounds_move_a_held_value() -> None:
    config = RouteConfig(max_hedge_after_s=1.0)
    d = decide(config, 1.5, observe(estimate(1.52)), KNOBS)
    assert d == Decision(1.0, True, "hysteresis_hold,clamped_max", "controller")
    few = decide(config, 1.5, observe(None), KNOBS)
    assert few == Decision(1.0, True, "too_few_samples,clamped_max", "controller")


# --- rule 8: flag --------------------------------------------------------------------------


def test_backups_rarely_win_flag() -> None:
    flagged = observe(estimate(1.6), hedges=20, backup_win_rate=0.1)
    d = decide(CONFIG, 2.0, flagged, KNOBS)
    assert d == Decision(1.6, True, "target,backups_rarely_win", "controller")
    too_few_hedges = observe(estimate(1.6), hedges=19, backup_win_rate=0.1)
    assert decide(CONFIG, 2.0, too_few_hedges, KNOBS).reason == "target"
    wins_enough = observe(estimate(1.6), hedges=200, backup_win_rate=0.2)
    assert decide(CONFIG, 2.0, wins_enough, KNOBS).reason == "target"
    pinned = decide(RouteConfig(pinned_hedge_after_s=1.0), 1.0, flagged, KNOBS)
    assert pinned.reason == "pinned,backups_rarely_win"


# --- configuration and validation ----------------------------------------------------------


def test_knobs_from_settings() -> None:
    settings = Settings(
        min_samples=80,
        hysteresis=0.1,
        max_step_down=0.5,
        max_step_up=0.25,
        min_backup_win_rate=0.3,
    )
    assert PolicyKnobs.from_settings(settings) == PolicyKnobs(
        min_samples=80,
        hysteresis=0.1,
        max_step_down=0.5,
        max_step_up=0.25,
        min_backup_win_rate=0.3,
        min_hedges_for_flag=20,
    )
    assert PolicyKnobs.from_settings(Settings()) == PolicyKnobs()


def test_estimate_budget_must_match_route_budget() -> None:
    with pytest.raises(ValueError, match=r"observation\.estimate\.budget"):
        decide(CONFIG, 1.0, observe(estimate(1.0, budget=0.05)), KNOBS)


@pytest.mark.parametrize("current", [0.0, -1.0, float("nan"), float("inf"), True])
def test_bad_current_value_is_rejected(current: float) -> None:
    with pytest.raises(ValueError, match="current_hedge_after_s"):
        decide(CONFIG, current, observe(estimate(1.0)), KNOBS)


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: RouteConfig(budget=0.0), "budget"),
        (lambda: RouteConfig(budget=1.0), "budget"),
        (lambda: RouteConfig(default_hedge_after_s=0.0), "default_hedge_after_s"),
        (lambda: RouteConfig(min_hedge_after_s=5.0, max_hedge_after_s=1.0), "min_hedge_after_s"),
        (lambda: RouteConfig(pinned_hedge_after_s=float("nan")), "pinned_hedge_after_s"),
        (lambda: PolicyKnobs(min_samples=0), "min_samples"),
        (lambda: PolicyKnobs(hysteresis=1.0), "hysteresis"),
        (lambda: PolicyKnobs(max_step_down=-0.1), "max_step_down"),
        (lambda: PolicyKnobs(max_step_up=0.0), "max_step_up"),
        (lambda: PolicyKnobs(min_backup_win_rate=1.5), "min_backup_win_rate"),
        (lambda: PolicyKnobs(min_hedges_for_flag=-1), "min_hedges_for_flag"),
        (lambda: observe(None, short_rate=1.2), "short_window_hedge_rate"),
        (lambda: observe(None, backup_win_rate=-0.1), "backup_win_rate"),
        (lambda: observe(None, hedges=-1), "hedges"),
        (lambda: dataclasses.replace(observe(None), window_s=0.0), "window_s"),
    ],
)
def test_bad_configuration_names_the_field(factory, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        factory()


def test_target_equal_to_current_is_a_no_op() -> None:
    d = decide(CONFIG, 1.0, observe(estimate(1.0)), KNOBS)
    assert d == Decision(1.0, False, "target", "controller")


def test_no_target_without_censoring_holds_instead_of_raising() -> None:
    # 60 uncensored samples: no time is confidently under a 2% budget, but nothing was censored,
    # so there is no hidden tail to chase upward.
    x = stats.lognorm(s=0.6).rvs(60, random_state=np.random.default_rng(3))
    est = estimate_ttft(x, [False] * 60, budget=0.02)
    assert est.target_s is None and est.censored == 0
    d = decide(dataclasses.replace(CONFIG, budget=0.02), 1.5, observe(est), KNOBS)
    assert (d.hedge_after_s, d.reason, d.applied) == (1.5, "too_few_samples", False)


# --- rule 8b: hedges that did not lower the P99 --------------------------------------------


def observe_p99(primary_p99_s: float | None, call_p99_s: float | None, *, hedges: int = 40) -> Observation:
    """An observation whose primary KM P99 and call-level P99 are given."""
    est = dataclasses.replace(estimate(1.6), p99_s=primary_p99_s)
    return dataclasses.replace(
        observe(est, hedges=hedges, backup_win_rate=0.5), call_ttft_samples=900, call_p99_s=call_p99_s
    )


def test_hedges_that_did_not_lower_p99_are_flagged_with_their_inputs() -> None:
    # limit = (1 - 0.05) * 4.0 = 3.8 s: a call-level P99 of 3.9 s is not a real improvement
    d = decide(CONFIG, 2.0, observe_p99(4.0, 3.9), KNOBS)
    assert codes(d) == ["target", "hedges_did_not_lower_p99"]
    assert d.details == {
        "p99_check": {
            "call_p99_s": 3.9,
            "primary_p99_s": 4.0,
            "primary_p99_is_lower_bound": False,
            "min_p99_improvement": 0.05,
            "limit_s": pytest.approx(3.8),
            "call_ttft_samples": 900,
            "hedges": 40,
            "flagged": True,
        }
    }
    at_limit = decide(CONFIG, 2.0, observe_p99(4.0, 3.8), KNOBS)
    assert "hedges_did_not_lower_p99" in codes(at_limit)  # >= the limit is flagged


def test_hedges_that_lowered_p99_are_not_flagged_but_the_check_is_recorded() -> None:
    d = decide(CONFIG, 2.0, observe_p99(4.0, 2.5), KNOBS)
    assert codes(d) == ["target"]
    assert d.details["p99_check"]["flagged"] is False and d.details["p99_check"]["call_p99_s"] == 2.5


def test_p99_check_needs_enough_hedges_and_both_p99s() -> None:
    few = decide(CONFIG, 2.0, observe_p99(4.0, 4.0, hedges=KNOBS.min_hedges_for_flag - 1), KNOBS)
    assert codes(few) == ["target"] and few.details == {}
    # primary P99 not identified: its lower bound (max_observed_s = 3.0 s) proves an improvement
    # when the call-level P99 is under 0.95 * 3.0 = 2.85 s, and decides nothing above it
    censored = decide(CONFIG, 2.0, observe_p99(None, 2.9), KNOBS)
    assert codes(censored) == ["target"] and censored.details == {}
    helped = decide(CONFIG, 2.0, observe_p99(None, 2.0), KNOBS)
    assert codes(helped) == ["target"]
    assert helped.details["p99_check"]["primary_p99_is_lower_bound"] is True
    assert helped.details["p99_check"]["primary_p99_s"] == 3.0 and not helped.details["p99_check"]["flagged"]
    no_calls = decide(CONFIG, 2.0, observe_p99(4.0, None), KNOBS)
    assert codes(no_calls) == ["target"] and no_calls.details == {}


def test_p99_flag_on_pinned_and_disabled_routes_too() -> None:
    pinned = decide(RouteConfig(pinned_hedge_after_s=1.0), 1.0, observe_p99(4.0, 4.2), KNOBS)
    assert pinned.reason == "pinned,hedges_did_not_lower_p99"
    margin = dataclasses.replace(KNOBS, min_p99_improvement=0.0)  # any improvement is enough
    assert "hedges_did_not_lower_p99" not in decide(CONFIG, 2.0, observe_p99(4.0, 3.99), margin).reason


def test_every_knob_comes_from_the_environment(monkeypatch) -> None:
    env = {
        "HEDGEROW_CONTROLLER_INTERVAL_S": "7.5",
        "HEDGEROW_LEASE_TTL_S": "22",
        "HEDGEROW_WINDOW_S": "1800",
        "HEDGEROW_MAX_WINDOW_S": "7200",
        "HEDGEROW_SHORT_WINDOW_S": "120",
        "HEDGEROW_MIN_SAMPLES": "80",
        "HEDGEROW_CONFIDENCE": "0.9",
        "HEDGEROW_HYSTERESIS": "0.1",
        "HEDGEROW_MAX_STEP_DOWN": "0.5",
        "HEDGEROW_MAX_STEP_UP": "0.25",
        "HEDGEROW_MIN_BACKUP_WIN_RATE": "0.3",
        "HEDGEROW_MIN_HEDGES_FOR_FLAG": "5",
        "HEDGEROW_SHORT_WINDOW_MIN_CALLS": "40",
        "HEDGEROW_MIN_P99_IMPROVEMENT": "0.1",
        "HEDGEROW_P99_TOLERANCE": "0.05",
        "HEDGEROW_MIN_BACKUP_SAMPLES": "40",
        "HEDGEROW_CLIENT_BUDGET_BURST": "4",
        "HEDGEROW_SHORT_WINDOW_COUNTS_DENIED": "true",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert (
        settings.controller_interval_s,
        settings.lease_ttl_s,
        settings.window_s,
        settings.max_window_s,
        settings.short_window_s,
        settings.confidence,
    ) == (7.5, 22.0, 1800.0, 7200.0, 120.0, 0.9)
    assert PolicyKnobs.from_settings(settings) == PolicyKnobs(
        min_samples=80,
        hysteresis=0.1,
        max_step_down=0.5,
        max_step_up=0.25,
        min_backup_win_rate=0.3,
        min_hedges_for_flag=5,
        short_window_min_calls=40,
        min_p99_improvement=0.1,
        p99_tolerance=0.05,
        min_backup_samples=40,
        client_budget_burst=4.0,
        short_window_counts_denied=True,
    )
    doc = Settings.__doc__ or ""
    for name in env:  # every knob is documented in the settings docstring
        assert name.removeprefix("HEDGEROW_").lower() in doc, name
    monkeypatch.setenv("HEDGEROW_MIN_P99_IMPROVEMENT", "1.5")
    with pytest.raises(ValueError, match="min_p99_improvement"):
        Settings()


def test_short_window_min_calls_knob() -> None:
    obs = observe(estimate(0.5), short_calls=30, short_rate=0.5)
    assert decide(CONFIG, 1.0, obs, KNOBS).reason == "over_budget_hold"
    strict = dataclasses.replace(KNOBS, short_window_min_calls=31)
    assert codes(decide(CONFIG, 1.0, obs, strict)) == ["target", "step_down_limited"]


def test_short_window_target_is_taken_when_over_budget_and_higher() -> None:
    obs = dataclasses.replace(observe(estimate(1.2), short_calls=60, short_rate=0.5), short_window_target_s=3.1)
    assert decide(CONFIG, 1.0, obs, KNOBS) == Decision(3.1, True, "raise_over_budget", "controller")
    # the long target alone would have been held (over budget, lower than current)
    low = dataclasses.replace(observe(estimate(0.5), short_calls=60, short_rate=0.5), short_window_target_s=2.0)
    assert decide(CONFIG, 1.0, low, KNOBS) == Decision(2.0, True, "raise_over_budget", "controller")
    # not over budget: the short window's target is ignored
    calm = dataclasses.replace(observe(estimate(1.2), short_calls=60, short_rate=0.05), short_window_target_s=3.1)
    assert decide(CONFIG, 1.0, calm, KNOBS).hedge_after_s == 1.2
    # lower than what the long window gives: ignored
    lower = dataclasses.replace(observe(estimate(4.0), short_calls=60, short_rate=0.5), short_window_target_s=3.1)
    assert decide(CONFIG, 1.0, lower, KNOBS).hedge_after_s == 4.0
    # still clamped
    high = dataclasses.replace(observe(estimate(1.2), short_calls=60, short_rate=0.5), short_window_target_s=50.0)
    assert decide(CONFIG, 1.0, high, KNOBS) == Decision(30.0, True, "raise_over_budget,clamped_max", "controller")
    with pytest.raises(ValueError, match="short_window_target_s"):
        dataclasses.replace(obs, short_window_target_s=-1.0)


# --- rule 3b: efficiency ---------------------------------------------------------------------


def _lump_samples() -> tuple[np.ndarray, np.ndarray]:
    """The hedge_model worked number: 87% fast, 12% long prompts at 0.45-0.55 s, 1% slow host."""
    rng = np.random.default_rng(7)
    n = 10_000
    kind = rng.choice(3, size=n, p=[0.87, 0.12, 0.01])
    ttft = np.where(
        kind == 0, rng.uniform(0.05, 0.3, n), np.where(kind == 1, rng.uniform(0.45, 0.55, n), rng.uniform(1.0, 5.0, n))
    )
    return ttft, np.zeros(n, dtype=bool)


def _sampled_observation(ttft: np.ndarray, censored: np.ndarray, **extra) -> Observation:
    est = estimate_ttft(ttft, censored, budget=0.10)
    fields = {
        "estimate": est,
        "window_s": 3600.0,
        "calls": ttft.size,
        "observed_hedge_rate": 0.0,
        "backup_win_rate": None,
        "hedges": 0,
        "short_window_calls": 0,
        "short_window_hedge_rate": None,
        "primary_durations_s": tuple(ttft.tolist()),
        "primary_censored": tuple(censored.tolist()),
    }
    fields.update(extra)
    return Observation(**fields)


def test_efficient_raise_above_a_budget_target_whose_hedges_do_not_pay() -> None:
    ttft, censored = _lump_samples()
    obs = _sampled_observation(ttft, censored)
    d = decide(CONFIG, 0.6, obs, KNOBS)
    assert codes(d) == ["efficient_raise"]
    eff = d.details["efficiency"]
    assert eff["budget_target_s"] == pytest.approx(0.483, abs=5e-4)
    assert d.hedge_after_s == eff["efficient_target_s"] == pytest.approx(0.5494, abs=5e-5)
    assert eff["search_top_s"] == pytest.approx(obs.estimate.p99_s)
    assert eff["hedge_rate_at_budget_target"] == pytest.approx(0.094, abs=5e-4)
    assert eff["hedge_rate_at_efficient_target"] == pytest.approx(0.010, abs=5e-4)
    assert eff["win_probability_at_budget_target"] < 0.2
    assert eff["win_probability_at_efficient_target"] > 0.9
    assert eff["backup_curve"] == "primary" and eff["bucket_replay"] is False
    # the rest of the rules still apply: from 2.0 s the decrease is step-limited
    assert codes(decide(CONFIG, 2.0, obs, KNOBS)) == ["efficient_raise", "step_down_limited"]


def test_efficiency_keeps_the_budget_target_when_early_hedges_pay() -> None:
    # memoryless primaries, fast backups: each second of delay adds to the tail, so with no
    # tolerance the budget target stays (its hedges are the ones that cut the P99)
    rng = np.random.default_rng(11)
    ttft = rng.exponential(1.0, 5000)
    censored = np.zeros(ttft.size, dtype=bool)
    backups = rng.exponential(0.1, 300)
    obs = _sampled_observation(
        ttft, censored, backup_durations_s=tuple(backups.tolist()), backup_censored=(False,) * 300
    )
    strict = dataclasses.replace(KNOBS, p99_tolerance=0.0)
    d = decide(CONFIG, obs.estimate.target_s, obs, strict)
    assert d.hedge_after_s == obs.estimate.target_s and codes(d) == ["target"]
    eff = d.details["efficiency"]
    assert eff["efficient_target_s"] == eff["budget_target_s"] and eff["backup_curve"] == "backup"
    # with fewer backup samples than the knob asks for, the primary's curve stands in
    few = dataclasses.replace(strict, min_backup_samples=301)
    assert decide(CONFIG, 1.0, obs, few).details["efficiency"]["backup_curve"] == "primary"


def test_rarely_winning_backups_raise_the_efficient_target_to_the_primary_p99() -> None:
    # memoryless primaries, fast backups: the model keeps the budget target (~2.3 s, its hedges
    # cut the P99), but the window's hedges won only 10% of the time (the model's premise
    # failed): the target goes to the top of the search, the primary's KM P99 (~4.6 s)
    rng = np.random.default_rng(11)
    ttft = rng.exponential(1.0, 5000)
    censored = np.zeros(ttft.size, dtype=bool)
    backups = rng.exponential(0.1, 300)
    base = _sampled_observation(
        ttft, censored, backup_durations_s=tuple(backups.tolist()), backup_censored=(False,) * 300
    )
    strict = dataclasses.replace(KNOBS, p99_tolerance=0.0)
    target_s, p99_s = base.estimate.target_s, base.estimate.p99_s
    calm = dataclasses.replace(base, hedges=300, backup_win_rate=0.5)
    d_calm = decide(CONFIG, target_s, calm, strict)
    assert d_calm.details["efficiency"]["rarely_win_raise"] is False
    assert d_calm.hedge_after_s == target_s and codes(d_calm) == ["target"]
    losing = dataclasses.replace(base, hedges=300, backup_win_rate=0.1)
    d = decide(CONFIG, target_s, losing, strict)
    assert codes(d) == ["efficient_raise", "backups_rarely_win"]
    eff = d.details["efficiency"]
    assert eff["rarely_win_raise"] is True and eff["model_target_s"] == target_s
    assert d.hedge_after_s == eff["efficient_target_s"] == eff["search_top_s"] == pytest.approx(p99_s)
    assert eff["hedge_rate_at_efficient_target"] == pytest.approx(0.01, abs=2e-3)
    # the prediction at the raised target: later hedges, a longer predicted tail
    assert eff["predicted_p99_at_efficient_target_s"] > eff["predicted_p99_at_budget_target_s"]
    # too few hedges to trust the win rate: no raise; the max clamp still caps the search
    few = dataclasses.replace(losing, hedges=KNOBS.min_hedges_for_flag - 1)
    assert decide(CONFIG, target_s, few, strict).details["efficiency"]["rarely_win_raise"] is False
    capped = dataclasses.replace(CONFIG, max_hedge_after_s=3.0)
    assert decide(capped, target_s, losing, strict).hedge_after_s == pytest.approx(3.0)


def test_bucket_replay_is_used_when_start_times_are_given() -> None:
    ttft, censored = _lump_samples()
    obs = _sampled_observation(ttft, censored, primary_started_s=tuple(range(ttft.size)))
    assert decide(CONFIG, 0.6, obs, KNOBS).details["efficiency"]["bucket_replay"] is True
    off = dataclasses.replace(KNOBS, client_budget_burst=0.0)
    assert decide(CONFIG, 0.6, obs, off).details["efficiency"]["bucket_replay"] is False


def test_denied_hedges_count_as_wanted_in_the_short_window() -> None:
    # 6% sent, 14% wanted: the bucket hid a threshold that asks for more than the budget
    obs = dataclasses.replace(observe(estimate(0.5), short_calls=200, short_rate=0.06), short_window_wanted_rate=0.14)
    counting = dataclasses.replace(KNOBS, short_window_counts_denied=True)
    assert decide(CONFIG, 1.0, obs, counting).reason == "over_budget_hold"
    up = dataclasses.replace(obs, estimate=estimate(1.4))
    assert decide(CONFIG, 1.0, up, counting).reason == "raise_over_budget"
    # the default tests the hedges sent only
    assert KNOBS.short_window_counts_denied is False
    assert codes(decide(CONFIG, 1.0, obs, KNOBS)) == ["target", "step_down_limited"]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"primary_durations_s": (0.1, 0.2), "primary_censored": (False,)}, "primary_durations_s"),
        ({"backup_durations_s": (0.1,), "backup_censored": ()}, "backup_durations_s"),
        ({"primary_durations_s": (0.1, -0.2), "primary_censored": (False, False)}, "finite and >= 0"),
        (
            {"primary_durations_s": (0.1,), "primary_censored": (False,), "primary_started_s": (1.0, 2.0)},
            "primary_started_s",
        ),
        ({"wanted_hedge_rate": 1.5}, "wanted_hedge_rate"),
        ({"short_window_wanted_rate": -0.1}, "short_window_wanted_rate"),
    ],
)
def test_bad_sample_fields_name_the_field(fields: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        dataclasses.replace(observe(estimate(0.5)), **fields)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"p99_tolerance": -0.01}, "p99_tolerance"),
        ({"min_backup_samples": 0}, "min_backup_samples"),
        ({"client_budget_burst": float("nan")}, "client_budget_burst"),
    ],
)
def test_bad_efficiency_knobs_name_the_knob(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        PolicyKnobs(**kwargs)
    with pytest.raises(TypeError, match="short_window_counts_denied"):
        PolicyKnobs(short_window_counts_denied=1)  # type: ignore[arg-type]


# --- rule 3: censored raise only when censoring is the reason, and bounded -------------------


def _ops_review_sample(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ops review's repro shape: lognormal primary TTFT (mu -0.5, sigma 0.8), hedged at
    2.0 s with a backup of the same law; a primary whose backup answers first is censored at
    that moment. Returns (durations_s, censored)."""
    rng = np.random.default_rng(seed)
    primary = rng.lognormal(-0.5, 0.8, n)
    backup_at = 2.0 + rng.lognormal(-0.5, 0.8, n)
    censored = (primary > 2.0) & (backup_at < primary)
    return np.where(censored, backup_at, primary), censored


def test_few_samples_with_a_little_censoring_hold_instead_of_raising() -> None:
    # The ops review: 120 calls, 3 primaries censored, budget 0.05. Before the fix every tick
    # on the same data doubled the threshold (2 -> 4 -> 8 -> 16 -> 30 s, clamped_max).
    seed = next(s for s in range(200) if int(_ops_review_sample(seed=s)[1].sum()) == 3)
    durations, censored = _ops_review_sample(seed=seed)
    est = estimate_ttft(durations, censored, budget=0.05)
    assert est.censored == 3 and est.target_s is None and est.p95_s is not None
    assert est.too_few_for_budget and est.target_all_events_s is None
    config = RouteConfig(budget=0.05)
    current = 2.0
    for _ in range(4):
        d = decide(config, current, observe(est), KNOBS)
        assert (d.hedge_after_s, d.reason, d.applied) == (2.0, "too_few_samples", False)
        current = d.hedge_after_s


def test_censored_raise_stops_above_the_censored_region() -> None:
    # Genuinely censored: every primary slower than 0.85 s was cancelled there. The first tick
    # raises 0.8 -> 1.6 s; on the same data the next ones hold (1.6 s > 0.85 s, the largest
    # censoring time): at most one raise of (1 + max_step_up) x 0.85 s per batch of data.
    x = stats.lognorm(s=0.6).rvs(1000, random_state=np.random.default_rng(2))
    cut = 0.85
    est = estimate_ttft(np.minimum(x, cut), x > cut, budget=0.10)
    assert est.target_s is None and not est.too_few_for_budget
    assert est.target_all_events_s == pytest.approx(cut) and est.max_censored_s == pytest.approx(cut)
    values = []
    current = 0.8
    for _ in range(4):
        d = decide(CONFIG, current, observe(est), KNOBS)
        values.append((d.hedge_after_s, codes(d)[0]))
        current = d.hedge_after_s
    assert values == [(1.6, "censored_raise")] + [(1.6, "censored_hold")] * 3
    assert max(v for v, _ in values) <= (1 + KNOBS.max_step_up) * cut
    # at exactly the largest censoring time it still raises (the censoring is at the value)
    at = decide(CONFIG, 3.0, observe(estimate(None, max_censored_s=3.0)), KNOBS)
    assert (at.hedge_after_s, at.reason) == (6.0, "censored_raise")
    above = decide(CONFIG, 3.01, observe(estimate(None, max_censored_s=3.0)), KNOBS)
    assert (above.hedge_after_s, above.reason, above.applied) == (3.01, "censored_hold", False)


def test_too_few_for_the_budget_tail_holds_even_with_censoring() -> None:
    d = decide(CONFIG, 1.5, observe(estimate(None, all_events_s=None)), KNOBS)
    assert d == Decision(1.5, False, "too_few_samples", "controller")
