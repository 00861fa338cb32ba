"""The first candidate of each query's sorted list where a predicted survival is at or below a level,
found without evaluating the whole list (``hedge_model.predicted_quantile_levels``' search).

A query has a sorted candidate list (times, seconds), a level, an *exact* function (the predicted
survival with the bucket replay, not monotone: the denied share can rise with ``x``) and a
*bound* function that is non-increasing along the list and at or below the exact one up to a
rounding factor (the survival without the replay: the replay only adds the denied share
``d * (1 - G) >= 0``). Every candidate whose bound is above ``level * (1 + BOUND_SLACK)`` has an
exact value above the level, so the answer is at or after the first candidate whose bound is not:
:func:`first_at_or_below` finds that one by a search that narrows each query's interval
``PROBES + 1``-fold per round, then evaluates the exact function from there on, ``WINDOW``
candidates per query and round (doubling each round), until a candidate qualifies or the list
ends. The answer is the one a full evaluation gives, to the bit (the exact function is evaluated
at the same candidates with the same operations; only candidates that cannot qualify are
skipped). Cost: ``O(log_(PROBES+1)(n) + rounds)`` vectorised rounds over all queries, instead of
``queries x n`` evaluations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["BOUND_SLACK", "DENSE_LIMIT", "PROBES", "WINDOW", "Evaluate", "first_at_or_below"]

#: Relative slack of the bound's test: the exact value is a product of at most four rounded
#: operations more than the bound's, so it is at least ``bound * (1 - 4 eps)``; 1e-9 is far
#: above that (eps = 2.2e-16) and far below any level's resolution.
BOUND_SLACK = 1e-9
#: Probes per query and round of the bound's search: the interval narrows 17-fold a round.
PROBES = 16
#: Candidates per query of the exact scan's first round (doubled each round after).
WINDOW = 8
#: Up to this many candidates in all, the bound's search costs more numpy calls than it saves
#: evaluations: the exact function is evaluated at every candidate in one round.
DENSE_LIMIT = 8192

#: ``f(rows, positions) -> values``: rows (q,) int, positions (q, p) int -> (q, p) float.
Evaluate = Callable[[np.ndarray, np.ndarray], np.ndarray]


def first_at_or_below(
    lengths: np.ndarray,
    levels: np.ndarray,
    candidates: Evaluate,
    bound: Evaluate,
    exact: Evaluate,
) -> np.ndarray:
    """Per level and query, the first candidate whose exact value is ``<= level``, or ``inf``.

    The bound is searched for the highest level (every level's answer is at or after its
    crossing); the exact values are then read once per candidate for every level.

    Args:
        lengths: candidates per query, shape (q,), >= 0.
        levels: the levels, shape (m,), >= 0.
        candidates: the candidate times at ``(query, position)``, sorted ascending along a
            query's positions.
        bound: non-increasing along a query's positions, and at most ``exact * (1 +
            BOUND_SLACK)`` at every candidate.
        exact: the function whose first crossings are wanted.

    Returns:
        Shape (m, q), the candidate times (``inf`` where no candidate qualifies).
    """
    q = lengths.size
    lengths = lengths.astype(np.int64)
    top = float(levels.max()) * (1.0 + BOUND_SLACK)
    lo = np.zeros(q, dtype=np.int64)
    hi = lengths.copy()
    steps = np.arange(1, PROBES + 1)
    dense = int(lengths.sum()) <= DENSE_LIMIT
    open_ = np.flatnonzero(lo < hi) if not dense else np.empty(0, dtype=np.int64)
    while open_.size:  # the first position whose bound is <= the highest level (1 + slack)
        width = hi[open_] - lo[open_]
        pos = lo[open_, None] + (width[:, None] * steps) // (PROBES + 1)
        low = bound(open_, pos) <= top
        hi[open_] = np.where(low, pos, hi[open_, None]).min(axis=1)
        lo[open_] = np.where(low, lo[open_, None], pos + 1).max(axis=1)
        open_ = open_[lo[open_] < hi[open_]]
    found = np.full((levels.size, q), np.inf)
    start = lo
    window = max(int(lengths.max(initial=1)), 1) if dense else WINDOW
    open_ = np.flatnonzero(start < lengths)
    while open_.size:  # the exact values from there on, a window per round
        pos = start[open_, None] + np.arange(window)
        valid = pos < lengths[open_, None]
        pos = np.minimum(pos, lengths[open_, None] - 1)
        values = exact(open_, pos)
        times = candidates(open_, pos)
        for level, row in zip(levels.tolist(), found, strict=True):
            times_at = np.where(valid & (values <= level), times, np.inf).min(axis=1)
            row[open_] = np.minimum(row[open_], times_at)  # the first round that finds one keeps it
        start[open_] += window
        open_ = open_[np.isinf(found[:, open_]).any(axis=0) & (start[open_] < lengths[open_])]
        window *= 2
    return found
