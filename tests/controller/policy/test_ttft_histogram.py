"""The TTFT histogram's bucket table (``hedgerow.controller.policy.ttft_histogram``)."""

from __future__ import annotations

from hedgerow.controller.policy.ttft_histogram import BUCKET_ENDS_S, N_BUCKETS, bucket_bounds


def test_bucket_ends_are_the_upper_edges_and_the_overflows_lower_edge() -> None:
    assert BUCKET_ENDS_S.shape == (N_BUCKETS,)
    for index in range(N_BUCKETS):
        lower, upper = bucket_bounds(index)
        assert BUCKET_ENDS_S[index] == (upper if upper is not None else lower)
