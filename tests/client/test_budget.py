"""The hedge budget (token bucket): refill per call, burst cap, long-run bound."""

from __future__ import annotations

from hedgerow.client import HedgeBudget


def test_each_call_refills_budget_tokens_up_to_the_burst():
    bucket = HedgeBudget(0.5, 1)
    assert bucket.try_withdraw() and not bucket.try_withdraw()
    bucket.deposit()
    assert not bucket.try_withdraw()  # 0.5 token: not a whole hedge yet
    bucket.deposit()
    assert bucket.try_withdraw()


def test_burst_caps_what_idle_calls_can_save_up():
    bucket = HedgeBudget(0.5, 2)
    for _ in range(10):
        bucket.deposit()
    assert bucket.tokens == 2
    assert [bucket.try_withdraw() for _ in range(3)] == [True, True, False]


def test_long_run_hedges_stay_under_budget_times_calls_plus_burst():
    bucket = HedgeBudget(0.10, 10)
    hedges = 0
    for _ in range(1000):  # every call wants to hedge
        bucket.deposit()
        hedges += bucket.try_withdraw()
    assert 100 <= hedges <= 0.10 * 1000 + 10
