"""The hedge budget (token bucket of docs/DESIGN.md): refill per call, burst cap, long-run bound.

Directly on ``HedgeBudget`` (many calls, property-based with hypothesis) and through
``HedgingClient`` against slow scripted upstreams on 127.0.0.1 (real hedges, refused hedges
recorded as ``hedge_denied``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hedgerow.client import CallRecord, HedgeBudget, HedgePolicy, HedgingClient, Upstream
from tests.client.scripted_server import Script, ScriptedServer, Seen, chunk, sse, usage_chunk
from tests.helpers import BODY


def test_each_call_refills_budget_tokens_up_to_the_burst() -> None:
    bucket = HedgeBudget(0.5, 1)
    assert bucket.try_withdraw() and not bucket.try_withdraw()
    bucket.deposit()
    assert not bucket.try_withdraw()  # 0.5 token: not a whole hedge yet
    bucket.deposit()
    assert bucket.try_withdraw()


def test_burst_caps_what_idle_calls_can_save_up() -> None:
    bucket = HedgeBudget(0.5, 2)
    for _ in range(10):
        bucket.deposit()
    assert bucket.tokens == 2
    assert [bucket.try_withdraw() for _ in range(3)] == [True, True, False]


def test_long_run_hedges_stay_under_budget_times_calls_plus_burst() -> None:
    bucket = HedgeBudget(0.10, 10)
    hedges = 0
    for _ in range(1000):  # every call wants to hedge
        bucket.deposit()
        hedges += bucket.try_withdraw()
    assert 100 <= hedges <= 0.10 * 1000 + 10


# -- exactness and validation ------------------------------------------------------------------


def test_ten_calls_at_budget_one_tenth_earn_exactly_one_hedge() -> None:
    # Ten float deposits of 0.1 sum to 0.9999999999999999: that must still be a whole token.
    bucket = HedgeBudget(0.1, 1)
    assert bucket.try_withdraw()
    grants = []
    for _ in range(30):
        bucket.deposit()
        grants.append(bucket.try_withdraw())
    assert [i + 1 for i, granted in enumerate(grants) if granted] == [10, 20, 30]


@pytest.mark.parametrize(
    "budget, burst, field",
    [
        (-0.1, 1, "budget"),
        (1.5, 1, "budget"),
        (float("nan"), 1, "budget"),
        (True, 1, "budget"),
        (0.1, -1, "burst"),
        (0.1, float("inf"), "burst"),
        (0.1, "10", "burst"),
    ],
)
def test_bad_budget_arguments_name_the_field(budget: Any, burst: Any, field: str) -> None:
    with pytest.raises(ValueError, match=f"HedgeBudget.{field}"):
        HedgeBudget(budget, burst)


@settings(max_examples=300, deadline=None, database=None)
@given(
    budget=st.floats(0.0, 1.0),
    burst=st.floats(0.0, 20.0),
    wants=st.lists(st.booleans(), max_size=3000),
)
def test_hedges_never_exceed_budget_times_calls_plus_burst(budget: float, burst: float, wants: list[bool]) -> None:
    # Any pattern of calls wanting a hedge (True) or not: the bucket's long-run bound holds.
    bucket = HedgeBudget(budget, burst)
    hedges = 0
    for want in wants:
        bucket.deposit()
        if want:
            hedges += bucket.try_withdraw()
        assert 0.0 <= bucket.tokens <= burst
    assert hedges <= budget * len(wants) + burst + 1e-6


@settings(max_examples=300, deadline=None, database=None)
@given(budget=st.floats(0.0, 1.0), burst=st.floats(2.0, 20.0), calls=st.integers(1, 3000))
def test_every_call_wanting_a_hedge_gets_the_whole_budget(budget: float, burst: float, calls: int) -> None:
    # The bound is also reached: when every call wants a hedge, the bucket grants all it holds
    # (only the first deposit, into a full bucket, and a final fraction of a token are lost).
    bucket = HedgeBudget(budget, burst)
    hedges = 0
    for _ in range(calls):
        bucket.deposit()
        hedges += bucket.try_withdraw()
    assert hedges >= min(calls, burst + budget * (calls - 1) - 1 - 1e-6)


# -- through HedgingClient against slow scripted upstreams ---------------------------------------


def answer(first_delay_s: float) -> Script:
    """An OpenAI-style stream whose first token comes ``first_delay_s`` after the request."""
    chunks = [chunk("a ", role="assistant"), chunk("b "), chunk(finish="stop"), usage_chunk(5, 2)]
    return Script(pieces=sse(*chunks, gap_s=0.01, first_delay_s=first_delay_s))


async def run_waves(client: HedgingClient, waves: int, per_wave: int) -> list[CallRecord]:
    records: list[CallRecord] = []
    for _ in range(waves):
        results = await asyncio.gather(*(client.chat(BODY) for _ in range(per_wave)))
        records += [result.record for result in results]
    return records


async def test_a_burst_of_slow_calls_hedges_up_to_budget_burst_and_records_the_rest_as_denied() -> None:
    # Six concurrent calls, every primary slow (first token at 1.2 s, hedge due at 0.3 s), burst
    # 2: the bucket is full (2 tokens; the six deposits are capped), so exactly 2 calls hedge and
    # 4 are refused. Refused hedges are recorded, never raised, and go out on the wire.
    async with ScriptedServer(answer(first_delay_s=1.2)) as slow, ScriptedServer(answer(first_delay_s=0.0)) as fast:
        policy = HedgePolicy(hedge_after_s=0.3, budget=0.1, budget_burst=2)
        async with HedgingClient([Upstream("a", slow.base_url), Upstream("b", fast.base_url)], policy=policy) as client:
            records = await run_waves(client, waves=1, per_wave=6)
            left = client.budget.tokens
    hedged = [r for r in records if r.hedged]
    denied = [r for r in records if r.hedge_denied]
    assert len(hedged) == 2 and len(denied) == 4 and len(fast.requests) == 2
    assert all(r.hedge_reason == "ttft_timeout" and r.winner == "backup" and not r.hedge_denied for r in hedged)
    for record in denied:
        assert not record.hedged and record.hedge_reason is None and record.winner == "primary"
        assert len(record.attempts) == 1 and record.status == "ok"
        assert record.to_dict()["hedge_denied"] is True
    assert left == pytest.approx(0.0, abs=1e-9)


async def test_long_run_hedges_through_the_client_stay_under_budget_times_calls_plus_burst() -> None:
    # 20 slow calls in 4 waves of 5 at budget 0.4, burst 2: the first wave spends the burst, each
    # later wave deposits 5 x 0.4 = 2 tokens before its hedge timers fire. 8 hedges, 12 refused;
    # the bound is 0.4 x 20 + 2 = 10.
    async with ScriptedServer(answer(first_delay_s=1.0)) as slow, ScriptedServer(answer(first_delay_s=0.0)) as fast:
        policy = HedgePolicy(hedge_after_s=0.3, budget=0.4, budget_burst=2)
        async with HedgingClient([Upstream("a", slow.base_url), Upstream("b", fast.base_url)], policy=policy) as client:
            records = await run_waves(client, waves=4, per_wave=5)
    hedges = sum(r.hedged for r in records)
    assert hedges <= 0.4 * len(records) + 2
    assert hedges == 8 and sum(r.hedge_denied for r in records) == 12
    assert len(fast.requests) == hedges
    assert all(r.status == "ok" for r in records)


async def test_only_hedges_spend_the_budget_not_fast_calls_or_failovers() -> None:
    # Burst 1 and no refill: the single token must survive three fast calls and a failover, and
    # still pay for the hedge of the slow call that follows.
    def primary_script(index: int, seen: Seen) -> Script:
        if index == 3:
            return Script(status=503, content_type="application/json", pieces=[(0.0, b'{"error":"busy"}')])
        if index == 4:
            return answer(first_delay_s=1.2)
        return answer(first_delay_s=0.0)

    async with ScriptedServer(primary_script) as primary, ScriptedServer(answer(first_delay_s=0.0)) as backup:
        policy = HedgePolicy(hedge_after_s=0.4, budget=0.0, budget_burst=1)
        async with HedgingClient(
            [Upstream("a", primary.base_url), Upstream("b", backup.base_url)], policy=policy
        ) as client:
            records = [(await client.chat(BODY)).record for _ in range(5)]
            left = client.budget.tokens
    assert [(r.hedged, r.hedge_reason, r.hedge_denied) for r in records] == [
        (False, None, False),
        (False, None, False),
        (False, None, False),
        (True, "primary_error", False),  # failover: free
        (True, "ttft_timeout", False),  # the hedge takes the token
    ]
    assert left == 0.0
