"""The prediction curves of minute aggregates: each step of a survival curve read at bucket ends,
spread log-linearly since the previous step (rule 3 reads its predictions from them). Behind the
facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

import math

import numpy as np

from hedgerow.controller.policy.hedge_model import SurvivalCurve
from hedgerow.controller.policy.ttft_histogram import (
    BUCKET_ENDS_S,
    BUCKET_RATIO,
    BUCKETS_PER_DECADE,
    MIN_S,
    N_LOG_BUCKETS,
)

__all__ = [
    "SPREAD_STEPS",
    "spread_steps",
]


#: Sub-steps per bucket width (``BUCKET_RATIO``) of :func:`spread_steps`.
SPREAD_STEPS = 8


def spread_steps(curve: SurvivalCurve, steps: int = SPREAD_STEPS) -> SurvivalCurve:
    """``curve`` on bucket ends with each step spread log-linearly since the previous step.

    For the predictions only, on the minute aggregates. They read every duration at its
    bucket's end (``_minute_window``; ``BUCKET_RATIO``, 4.7% wide), so a Kaplan-Meier curve of
    them steps only there, and between occupied buckets (sparse samples: the backup's curve
    rests on a few dozen to a few hundred hedges) it is flat over several buckets. Every tail
    it predicts (``hedge_model.predicted_quantiles``: a quantile is a step time of ``S``, or a
    threshold plus one of ``G``) then stays flat over thresholds several percent apart and
    jumps, and the objective's cost tie-break (the largest threshold within ``p99_tolerance``,
    2%, of the lowest predicted tail) runs to the far end of such a plateau: a tie of the
    estimate, not of the distribution (the bucket-limited test, the budget target's predicted
    tail more than the tolerance above the lowest, reads the same jumps). Each step's drop is
    therefore spread evenly
    over sub-steps log-spaced over ``(t_prev, t]``, the interval since the previous step (the
    first step over its own bucket, ``(t / BUCKET_RATIO, t]``), ``steps`` per bucket width of
    the interval: within its bucket when the bucket below is occupied (the durations
    log-uniform within it), across the empty buckets of a gap otherwise. The curve keeps its
    value at every bucket end it stepped at (the first bucket's end, ``MIN_S``, is one: a
    window with a TTFT of 1 ms or less counts too). A curve with any step off the bucket ends
    (raw calls, ``bench/controller_eval.py`` without ``--minutes``) is returned as is. The
    budget target and the binomial tests read the measured curve (each duration at its
    bucket's end: the cautious side). The runs behind these choices: ``docs/evaluation.md``,
    "Rule 3: prediction curves spread over their buckets".
    Worked numbers (``tests/controller/policy/test_policy_buckets.py``): one step at the 0.5012 s end
    from 1 to 0.5 becomes 8 steps of 0.0625 at ``0.5012 / 1.047 * 1.047 ** (j / 8)``, so
    ``S(0.49 s)`` is 0.75 instead of 1; steps at the 1.0 s end (to 0.8) and the 1.9953 s end 15
    buckets up (to 0.4): the second becomes 120 sub-steps over (1.0, 1.9953], so
    ``S(1.413 s)`` is 0.6 instead of 0.8. On 20,000 lognormal calls the predicted P99 comes
    within 0.8% of the raw calls' (4.5% read at bucket ends).

    Args:
        curve: a survival curve (``hedge_model.SurvivalCurve``).
        steps: sub-steps per bucket width, >= 1 (1: the curve as is).

    Returns:
        The spread curve, or ``curve`` itself.
    """
    times = curve.times_s
    if times.size == 0 or steps <= 1:
        return curve
    # the nearest bucket end's index (0: the first bucket, durations up to MIN_S, ends at MIN_S)
    k = np.rint(np.log10(times / MIN_S) * BUCKETS_PER_DECADE)
    known = (k >= 0) & (k <= N_LOG_BUCKETS)
    on_ends = known & np.isclose(times, BUCKET_ENDS_S[np.where(known, k, 0).astype(np.int64)], rtol=1e-9)
    if not on_ends.all():
        return curve  # raw durations: kept as they are (see the docstring)
    values = curve.values
    previous_t = np.concatenate(([times[0] / BUCKET_RATIO], times[:-1]))
    previous_v = np.concatenate(([1.0], values[:-1]))
    ratio = times / previous_t
    per_bucket = np.log(ratio) / math.log(BUCKET_RATIO) * steps
    counts = np.maximum(1, np.ceil(per_bucket - 1e-6)).astype(np.int64)
    owner = np.repeat(np.arange(times.size), counts)
    starts = np.cumsum(counts) - counts
    j = np.arange(owner.size) - starts[owner] + 1
    fraction = j / counts[owner]
    sub_times = previous_t[owner] * ratio[owner] ** fraction
    sub_values = previous_v[owner] + (values - previous_v)[owner] * fraction
    last = j == counts[owner]
    sub_times[last] = times[owner[last]]
    return SurvivalCurve(sub_times, sub_values, curve.samples)
