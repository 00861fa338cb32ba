"""The minute aggregates' pure parts: vectorised buckets, counting, the stored encoding and its merge."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from hedgerow.controller.policy.minute_counts import (
    BACKUP_CENSORED,
    CALL_TTFT,
    PRIMARY_CENSORED,
    PRIMARY_OBSERVED,
    CallSamples,
    count_minutes,
    decode,
    decode_many,
    encode,
    merge_many,
    minute_index,
)
from hedgerow.controller.policy.ttft_histogram import N_BUCKETS, bucket_index, bucket_indices

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_bucket_indices_equal_bucket_index() -> None:
    rng = random.Random(1)
    values = [0.0, 1e-3, 0.0009999, 3631.0, 1e6] + [rng.lognormvariate(0, 2) for _ in range(2000)]
    assert bucket_indices(np.array(values)).tolist() == [bucket_index(v) for v in values]
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            bucket_indices(np.array([1.0, bad]))


def test_count_minutes_by_hand() -> None:
    plain = CallSamples(0.5, False, False, False, False, None, False, 0.5)
    hedged_backup_won = CallSamples(2.0, True, True, True, False, 0.3, False, 1.8)
    denied = CallSamples(3.0, False, False, False, True, None, False, 3.0)
    failover = CallSamples(None, False, False, False, False, None, False, None)
    hedged_primary_won = CallSamples(1.2, False, True, False, False, 0.1, True, 1.2)
    samples = [plain, hedged_backup_won, denied, failover, hedged_primary_won]
    started = [T0, T0 + timedelta(seconds=59.999), T0 + timedelta(seconds=60), T0, T0 + timedelta(seconds=5)]
    counts = count_minutes([7, 7, 7, 8, 7], started, samples)
    m = minute_index(T0)
    assert set(counts) == {(7, m), (7, m + 1), (8, m)}
    first = counts[(7, m)]
    assert first.counters() == (3, 2, 1, 0, 2)
    want = {
        PRIMARY_OBSERVED * N_BUCKETS + bucket_index(0.5): 1,
        PRIMARY_OBSERVED * N_BUCKETS + bucket_index(1.2): 1,
        PRIMARY_CENSORED * N_BUCKETS + bucket_index(2.0): 1,
        2 * N_BUCKETS + bucket_index(0.3): 1,
        BACKUP_CENSORED * N_BUCKETS + bucket_index(0.1): 1,
        CALL_TTFT * N_BUCKETS + bucket_index(0.5): 1,
        CALL_TTFT * N_BUCKETS + bucket_index(1.8): 1,
        CALL_TTFT * N_BUCKETS + bucket_index(1.2): 1,
    }
    assert dict(zip(first.keys.tolist(), first.counts.tolist(), strict=True)) == want
    assert first.keys.tolist() == sorted(want)
    assert counts[(7, m + 1)].counters() == (1, 0, 0, 1, 1)
    assert counts[(8, m)].counters() == (1, 0, 0, 0, 0) and counts[(8, m)].keys.size == 0
    with pytest.raises(ValueError, match="2 route ids"):
        count_minutes([1, 2], started, samples)


def test_encoding_round_trips_and_merges() -> None:
    keys, counts = np.array([3, 400, 1649]), np.array([1, 7, 2**31])
    blob = encode(keys, counts)
    assert len(blob) == 3 * 8
    assert [a.tolist() for a in decode(blob)] == [keys.tolist(), counts.tolist()]
    merged, fresh, nothing = merge_many(
        [blob, None, b""], [(np.array([0, 400]), np.array([5, 1])), (keys, counts), (np.zeros(0), np.zeros(0))]
    )
    assert [a.tolist() for a in decode(merged)] == [[0, 3, 400, 1649], [5, 1, 8, 2**31]]
    assert fresh == blob and nothing == b""
    with pytest.raises(ValueError, match="2 stored values but 1 additions"):
        merge_many([blob, None], [(keys, counts)])
    rows, all_keys, all_counts = decode_many([blob, b"", None, merged])
    assert rows.tolist() == [0, 0, 0, 3, 3, 3, 3]
    assert all_keys.tolist() == [3, 400, 1649, 0, 3, 400, 1649]
    assert all_counts.tolist() == [1, 7, 2**31, 5, 1, 8, 2**31]
    with pytest.raises(ValueError, match="whole"):
        decode(blob[:-1])
