"""The virtual-time cluster: determinism, conservation, hedging under the budget, the load shift."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from hedgerow.sim import (
    ClusterConfig,
    TraceRequest,
    VirtualCall,
    load_perf_model,
    simulate,
    synthetic_trace,
)

PERF = load_perf_model()


def _fingerprint(calls: list[VirtualCall]) -> list[tuple[object, ...]]:
    return [
        (
            c.primary,
            c.backup,
            c.hedged,
            c.hedge_denied,
            c.winner,
            c.ttft_s,
            c.end_s,
            c.primary_ttft_s,
            c.primary_censored,
            c.wasted_completion_tokens,
            c.wasted_prefill_tokens,
        )
        for c in calls
    ]


def _ttfts(calls: list[VirtualCall]) -> np.ndarray:
    return np.asarray([c.ttft_s for c in calls], dtype=float)


def test_single_request_follows_the_perf_model() -> None:
    """Alone on a replica: TTFT is its prefill, then one batch-1 decode step per further token."""
    trace = [TraceRequest(0.0, 1000, 50)]
    result = simulate(trace, PERF, ClusterConfig(replicas=2, export_delay_s=0.0))
    (call,) = result.calls
    prefill = PERF.prefill_time_s(1000, 1)
    assert call.ttft_s == pytest.approx(prefill, rel=1e-9)
    assert call.end_s == pytest.approx(prefill + 49 * PERF.decode_step_s(1), rel=1e-9)
    assert call.winner == "primary" and not call.hedged and not call.primary_censored
    assert call.primary_ttft_s == call.ttft_s


def test_prefill_blocks_decoding_of_the_batch() -> None:
    """A long prompt admitted mid-stream delays the next tokens of a running request."""
    config = ClusterConfig(replicas=2, balance="round_robin", export_delay_s=0.0)
    alone = simulate([TraceRequest(0.0, 100, 200)], PERF, config).calls[0]
    # calls 0 and 2 go to replica 0 (round robin over 2); call 1 (tiny) goes to replica 1
    trace = [TraceRequest(0.0, 100, 200), TraceRequest(0.5, 10, 1), TraceRequest(1.0, 8000, 2)]
    shared = simulate(trace, PERF, config).calls[0]
    assert shared.ttft_s == pytest.approx(alone.ttft_s)
    # the 8000-token prefill (~0.9 s) paused the first request's decoding
    assert shared.end_s is not None and alone.end_s is not None
    assert shared.end_s - alone.end_s > 0.5 * PERF.prefill_time_s(8000, 1)


def test_deterministic_for_a_seed_and_seed_matters() -> None:
    trace = synthetic_trace(1500, rate_per_s=8.0, seed=3)
    config = ClusterConfig(replicas=3, max_batch=16, shift_at_s=90.0, seed=7)
    first = simulate(trace, PERF, config, threshold=0.4)
    second = simulate(trace, PERF, config, threshold=0.4)
    assert _fingerprint(first.calls) == _fingerprint(second.calls)
    assert first.replica_stats == second.replica_stats
    other = simulate(trace, PERF, ClusterConfig(replicas=3, max_batch=16, shift_at_s=90.0, seed=8), threshold=0.4)
    assert [c.primary for c in other.calls] != [c.primary for c in first.calls]


def test_every_request_finishes_exactly_once() -> None:
    trace = synthetic_trace(2000, rate_per_s=10.0, seed=1)
    config = ClusterConfig(replicas=3, max_batch=16, shift_at_s=100.0, cancel_latency_s=0.05, export_delay_s=0.5)
    seen: list[int] = []
    last: list[float] = []

    def tick(now: float, visible: Sequence[VirtualCall]) -> None:
        assert all(c.visible_s is not None and c.visible_s <= now for c in visible)
        last.append(now)
        seen[:] = [c.index for c in visible]

    result = simulate(trace, PERF, config, threshold=0.3, tick=tick, tick_interval_s=5.0)
    assert len(result.calls) == len(trace)
    assert sorted(seen) == list(range(len(trace)))  # each call visible once, none twice
    assert len(set(seen)) == len(seen)
    for call in result.calls:
        assert call.winner in ("primary", "backup")
        assert call.ttft_s is not None and call.ttft_s >= 0
        assert call.end_s is not None and call.end_s >= call.arrival_s + call.ttft_s
        assert call.visible_s == pytest.approx(call.end_s + 0.5)
        if call.winner == "backup":
            assert call.hedged and call.primary_censored
            assert call.hedge_after_s is not None and call.ttft_s >= call.hedge_after_s
        assert call.primary_ttft_s == call.ttft_s
    # attempts: every one submitted ends finished or aborted; one finished winner per call
    stats = result.replica_stats
    attempts = len(trace) + sum(c.hedged for c in result.calls)
    assert sum(s["submitted"] for s in stats) == attempts
    assert sum(s["finished"] + s["aborted"] for s in stats) == attempts
    assert sum(s["finished"] for s in stats) >= len(trace)
    assert last[-1] >= max(c.visible_s for c in result.calls if c.visible_s is not None)  # none is None (above)


def test_tiny_threshold_hedges_everything_the_budget_allows() -> None:
    trace = synthetic_trace(1000, rate_per_s=5.0, seed=2)
    # budget 1.0: every call deposits a whole token, so every call may hedge
    result = simulate(trace, PERF, ClusterConfig(replicas=3, budget=1.0, budget_burst=1.0), threshold=0.0)
    assert all(c.hedged for c in result.calls)
    assert all(c.backup == (c.primary + 1) % 3 for c in result.calls)
    # budget 0.1, burst 10: every call wants a hedge, the bucket grants 0.1 per call + the burst
    result = simulate(trace, PERF, ClusterConfig(replicas=3, budget=0.1, budget_burst=10.0), threshold=0.001)
    hedged = sum(c.hedged for c in result.calls)
    denied = sum(c.hedge_denied for c in result.calls)
    assert hedged + denied == len(trace)
    assert 0.1 * len(trace) <= hedged <= 0.1 * len(trace) + 10


def test_no_threshold_never_hedges_and_wastes_nothing() -> None:
    trace = synthetic_trace(800, rate_per_s=8.0, seed=4)
    result = simulate(trace, PERF, ClusterConfig(replicas=3), threshold=None)
    assert not any(c.hedged or c.hedge_denied or c.backup is not None for c in result.calls)
    assert all(c.winner == "primary" and not c.primary_censored for c in result.calls)
    assert sum(c.wasted_prefill_tokens + c.wasted_completion_tokens for c in result.calls) == 0


def test_cancel_latency_makes_losers_waste_tokens() -> None:
    """Losers aborted at once waste no completion tokens; a slow abort lets them generate."""
    trace = synthetic_trace(1500, rate_per_s=10.0, seed=5)
    quick = simulate(trace, PERF, ClusterConfig(replicas=3, cancel_latency_s=0.0), threshold=0.2)
    slow = simulate(trace, PERF, ClusterConfig(replicas=3, cancel_latency_s=5.0), threshold=0.2)
    assert sum(c.hedged for c in quick.calls) > 50
    assert sum(c.wasted_completion_tokens for c in quick.calls) == 0
    assert sum(c.wasted_prefill_tokens for c in quick.calls) > 0
    assert sum(c.wasted_completion_tokens for c in slow.calls) > 0


def test_threefold_slowdown_raises_ttft() -> None:
    trace = synthetic_trace(3000, rate_per_s=8.0, seed=6)
    base = simulate(trace, PERF, ClusterConfig(replicas=3, balance="round_robin"))
    shifted = simulate(
        trace, PERF, ClusterConfig(replicas=3, balance="round_robin", shift_at_s=0.0, shift_replica=2, shift_factor=3.0)
    )
    slow = [c for c in shifted.calls if c.primary == 2]
    same = [c for c in base.calls if c.primary == 2]
    assert np.median(_ttfts(slow)) > 2.0 * np.median(_ttfts(same))
    assert np.percentile(_ttfts(shifted.calls), 99) > np.percentile(_ttfts(base.calls), 99)
    # the other replicas are untouched without hedging
    fast = [c.ttft_s for c in shifted.calls if c.primary == 0]
    assert fast == [c.ttft_s for c in base.calls if c.primary == 0]
    assert shifted.replica_stats[2]["busy_s"] > base.replica_stats[2]["busy_s"]


def test_hedging_cuts_the_tail_of_a_slow_replica() -> None:
    trace = synthetic_trace(3000, rate_per_s=8.0, seed=6)
    config = ClusterConfig(replicas=3, shift_at_s=0.0, shift_factor=3.0, budget=0.2)
    none = simulate(trace, PERF, config, threshold=None)
    hedged = simulate(trace, PERF, config, threshold=1.0)
    assert np.percentile(_ttfts(hedged.calls), 99) < np.percentile(_ttfts(none.calls), 99)
    assert any(c.winner == "backup" for c in hedged.calls)


def test_backup_samples_are_measured_from_the_backup_send() -> None:
    """The backup's sample: its TTFT from its own send when it won, else censored at the
    primary's first token; calls without a backup have none."""
    trace = synthetic_trace(3000, rate_per_s=8.0, seed=6)
    config = ClusterConfig(replicas=3, shift_at_s=0.0, shift_factor=3.0, budget=0.2)
    calls = simulate(trace, PERF, config, threshold=1.0).calls
    hedged = [c for c in calls if c.hedged]
    won = [c for c in hedged if c.winner == "backup"]
    lost = [c for c in hedged if c.winner == "primary"]
    assert len(won) > 20 and len(lost) > 20
    for c in won:  # call TTFT = hedge delay + the backup's own TTFT; the primary is censored
        assert not c.backup_censored and c.primary_censored
        assert c.ttft_s is not None and c.hedge_after_s is not None
        assert c.backup_ttft_s == pytest.approx(c.ttft_s - c.hedge_after_s)
    for c in lost:  # cancelled at the primary's first token, that long after its send
        assert c.backup_censored and not c.primary_censored
        assert c.primary_ttft_s is not None and c.hedge_after_s is not None
        assert c.backup_ttft_s == pytest.approx(c.primary_ttft_s - c.hedge_after_s)
        assert c.backup_ttft_s is not None and c.backup_ttft_s >= 0
    assert all(c.backup_ttft_s is None and not c.backup_censored for c in calls if not c.hedged)


def test_threshold_source_is_asked_at_each_arrival() -> None:
    trace = [TraceRequest(float(t), 200, 5) for t in range(10)]
    asked: list[float] = []

    def source(now: float) -> float | None:
        asked.append(now)
        return None if now < 5 else 2.5

    result = simulate(trace, PERF, ClusterConfig(replicas=2), threshold=source)
    assert asked == [float(t) for t in range(10)]
    assert [c.hedge_after_s for c in result.calls] == [None] * 5 + [2.5] * 5


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"replicas": 1}, "replicas"),
        ({"max_batch": 0}, "max_batch"),
        ({"shift_factor": 0.0}, "shift_factor"),
        ({"shift_replica": 5}, "shift_replica"),
        ({"balance": "least_loaded"}, "balance"),
        ({"budget": 1.5}, "budget"),
        ({"cancel_latency_s": math.nan}, "cancel_latency_s"),
    ],
)
def test_bad_cluster_config_names_the_field(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ClusterConfig(**kwargs)


def test_bad_inputs_are_clear_errors() -> None:
    unsorted = [TraceRequest(1.0, 10, 2), TraceRequest(0.5, 10, 2)]
    with pytest.raises(ValueError, match=r"trace\[1\]\.arrival_s"):
        simulate(unsorted, PERF)
    with pytest.raises(ValueError, match="threshold"):
        simulate([TraceRequest(0.0, 10, 2)], PERF, threshold=-1.0)
    with pytest.raises(ValueError, match="threshold"):
        simulate([TraceRequest(0.0, 10, 2)], PERF, threshold=lambda _now: math.inf)
    with pytest.raises(ValueError, match="tick_interval_s"):
        simulate([TraceRequest(0.0, 10, 2)], PERF, tick=lambda *_: None, tick_interval_s=0)
    assert simulate([], PERF).calls == []
