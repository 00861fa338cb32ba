"""Predict a hedged call's TTFT tail from the primary's and the backup's TTFT survival curves.

The budget target (``estimation``) says how *low* a threshold may go; this module says whether
going that low buys anything. It is the model behind the objective of ``policy`` (rule 3).

Model
-----
Let ``S(x) = P(T > x)`` be the primary's TTFT survival (Kaplan-Meier over the window's primary
samples, censored when the backup won) and ``G(y) = P(B > y)`` the backup's TTFT survival
*measured from the backup's own send* (Kaplan-Meier over the hedges' backup attempts, censored
when the primary won; the primary's ``S`` stands in while there are too few backup samples:
backups go to other upstreams of the same route). If primary and backup are independent, a call
hedged at ``t`` has

    P(call TTFT > x) = S(x)                    for x < t,
                       S(x) * G(x - t)         for x >= t,

and its predicted P99 is the smallest ``x`` with that probability ``<= 0.01``
(``predicted_quantiles``, vectorized over a grid of ``t``: the curve can only step down where
``S`` steps or at ``t`` plus a step of ``G``). Beyond the last observation ``S`` keeps its last
value, an upper bound, so an unidentified tail can only make the prediction pessimistic (or
``inf``), never optimistic. The predicted chance that a hedge at ``t`` wins is
``E_B[S(t + B)] / S(t)`` (``win_probability``); it explains the ``backups_rarely_win`` flag.

The client's token bucket: a wanted hedge is *denied* when the bucket is empty, and denials
bunch up exactly when many primaries are slow, i.e. on the calls that make the tail. With the
window's primary samples in arrival order, ``denial_probabilities`` replays the bucket (``budget``
tokens per call, ``burst`` capacity) for every candidate ``t``; then, for ``x >= t``,
``G(x - t)`` is replaced by ``(1 - d(x)) * G(x - t) + d(x)`` where ``d(x)`` is the share of
denied hedges among the calls still waiting at ``x`` (the Kaplan-Meier risk set). A low
threshold spends tokens on primaries that would have finished soon and leaves the bucket empty
for the slow ones; the replay makes that visible.

``efficient_threshold`` searches ``t`` on a geometric grid from the budget target up to a top
(the policy uses the primary's KM P99, capped by the route's max clamp: a threshold past the P99
without hedging cannot lower the P99, and staying at or below it keeps hedging as a guard
against drift) and returns the **largest** ``t`` whose predicted P99 is within ``tolerance``
(relative) of the grid's smallest one: the fewest hedges for (nearly) the same tail. Exception
(``bucket_limited``): when the budget target's own predicted P99 is more than ``tolerance`` above
the smallest, the raise is not about saving hedges at an equal tail but about the bucket running
dry at the budget target; then the **smallest** ``t`` with the smallest predicted P99 is taken
and the tolerance is not spent upwards. Reason: the replay's error in that regime is one-sided
(see below: it cannot see that earlier hedges drain an overloaded host's queue, so it overrates
high thresholds), and every step up lengthens the primaries' tail that the next tick's replay
sees (a feedback loop towards ever higher thresholds). For the same reason the policy does not
follow a bucket-limited choice above its current value (``policy`` rule 3, ``replay_hold``).

Assumption and where it fails
-----------------------------
Independence of the primary's and the backup's TTFT. It fails with correlated slowness: a long
prompt is slow to prefill on every upstream, an overloaded shared dependency slows both. Then
``G`` measured over all backups is too optimistic for the backups of slow primaries, the model
over-rates early hedges, and the efficient target errs *low* (towards the budget target, which
remains the floor), never past what the budget allows. The backup samples are censored when the
primary wins, so a backup of a nearly-finished primary contributes little (no bias under
independence). The model also ignores the load a backup adds and the load a winning backup
sheds (the cancelled primary leaves its queue); both matter under saturation. The replay takes
the primaries as they were under the *current* threshold: when a host is overloaded, a lower
threshold would also have drained its queue (fewer slow primaries, fewer wanted hedges), which
the replay cannot see, so after a slowdown the efficient target errs *high*: while an overload
transient is in the window, the bucket ran dry on its slow calls, and the search's minimum lies
where that one-sided error puts it. ``policy`` therefore does not follow a bucket-limited search
above the current value (``replay_hold``); a raise there comes from the budget's evidence. After
the transient, ``_policy_drift.detect_tail_recovery`` takes it out of the window. The replay
figures behind this: ``docs/evaluation.md``, "The hedge model in a queue".

Worked number (the code's own output; ``tests/controller/policy/test_hedge_model.py`` checks it):
10,000 uncensored primary TTFTs drawn with ``numpy.random.default_rng(7)``: 87% uniform in
0.05-0.3 s (short prompts), 12% uniform in 0.45-0.55 s (long prompts: their prefill), 1% uniform
in 1-5 s (a slow host); the backup curve is the primary's (too few backup samples). The budget
target at 10% is 0.483 s, inside the long-prompt lump, where 9.4% of calls would hedge; there the
predicted win probability is only 0.105 (the primary is about to finish) and the predicted P99
is 0.5492 s. At the top of the search, the primary's P99 of 0.5494 s, 1.0% of calls hedge, the
win probability is 0.93, and the predicted P99 is 0.5494 s (+0.05%, inside a 2% tolerance), so
the efficient target is 0.549 s: 9.4x fewer hedges for the same P99 (the P99.9 pays: 1.021 s
instead of 0.956 s).

Sources: the product form is the survival of ``min(T, t + B)`` for independent ``T`` and ``B``;
Kaplan & Meier (1958) (``_km.risk_table``); J. Dean and L. A. Barroso, "The Tail at
Scale", CACM 56(2), 2013, for hedged requests and their cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hedgerow.controller.policy._km import risk_table
from hedgerow.controller.policy._tail_search import Evaluate, first_at_or_below

__all__ = [
    "BucketReplay",
    "EfficientChoice",
    "SurvivalCurve",
    "denial_probabilities",
    "efficient_threshold",
    "km_survival",
    "predicted_quantile_levels",
    "predicted_quantiles",
    "predicted_survival",
    "win_probability",
]


@dataclass(frozen=True, slots=True)
class SurvivalCurve:
    """A right-continuous, non-increasing step function ``S(x) = P(TTFT > x)``.

    Attributes:
        times_s: the times at which ``S`` steps down, seconds, sorted ascending, shape (m,).
        values: ``S`` from each of those times on (up to the next one), shape (m,); ``S(x) = 1``
            before the first time and ``values[-1]`` from the last one on (beyond the last
            observation the curve is not identified; its last value is an upper bound).
        samples: how many durations (censored ones included) the curve was estimated from.

    Raises:
        ValueError: shapes differ, times not sorted ascending, or values not non-increasing in
            [0, 1].
    """

    times_s: np.ndarray
    values: np.ndarray
    samples: int
    #: ``S`` before the first time, then ``values``, shape (m + 1,): ``S(x)`` is
    #: ``_levels[number of times <= x]``
    _levels: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        times = np.asarray(self.times_s, dtype=float)
        values = np.asarray(self.values, dtype=float)
        if times.ndim != 1 or times.shape != values.shape:
            raise ValueError(f"times_s and values must be 1-D of one shape, got {times.shape} and {values.shape}")
        if times.size and (np.any(np.diff(times) <= 0) or not np.all(np.isfinite(times))):
            raise ValueError("times_s must be finite and strictly ascending")
        if values.size and (np.any(np.diff(values) > 1e-12) or values.min() < 0 or values.max() > 1 + 1e-12):
            raise ValueError("values must be non-increasing and in [0, 1]")
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "_levels", np.concatenate(([1.0], values)))

    def __call__(self, x_s: np.ndarray | Sequence[float] | float) -> np.ndarray:
        """Evaluate ``S`` at ``x_s`` (seconds, any shape); returns an array of that shape (a numpy
        scalar for a scalar ``x_s``)."""
        levels: np.ndarray = self._levels[np.searchsorted(self.times_s, np.asarray(x_s, dtype=float), side="right")]
        return levels

    @property
    def last_value(self) -> float:
        """``S`` beyond the last observation (1.0 when nothing was observed)."""
        return float(self.values[-1]) if self.values.size else 1.0


def km_survival(
    durations_s: Sequence[float] | np.ndarray,
    censored: Sequence[bool] | np.ndarray,
    weights: Sequence[float] | np.ndarray | None = None,
) -> SurvivalCurve:
    """Kaplan-Meier survival curve of right-censored durations.

    Args:
        durations_s: one duration per attempt, seconds, shape (n,), finite and >= 0.
        censored: shape (n,), True where the duration is a censoring time.
        weights: how many attempts each entry stands for, shape (n,); None: 1 each.

    Returns:
        The curve (``_km.risk_table``: the product-limit estimate), stepping only at the
        observed (uncensored) times; with no uncensored sample it is 1 everywhere.

    Raises:
        ValueError: empty input, lengths differ (weights included), or a negative or non-finite
            duration.
    """
    durations = np.asarray(durations_s, dtype=float)
    flags = np.asarray(censored, dtype=bool)
    if durations.ndim != 1 or durations.size == 0:
        raise ValueError("durations_s must be a non-empty 1-D sequence of seconds")
    if flags.shape != durations.shape:
        raise ValueError(f"durations_s and censored differ in length ({durations.size} != {flags.size})")
    if not np.all(np.isfinite(durations)) or durations.min() < 0:
        raise ValueError("durations_s must be finite and >= 0 seconds")
    w = None if weights is None else np.asarray(weights, dtype=float)
    if w is not None and w.shape != durations.shape:
        raise ValueError(f"weights has shape {w.shape}, durations_s {durations.shape}")
    samples = int(durations.size if w is None else w.sum())
    if flags.all():
        return SurvivalCurve(np.empty(0), np.empty(0), samples)
    table = risk_table(durations, flags, w)
    keep = table.event_mask  # S steps only where a first token was seen
    times, values = table.times_s, table.survival()
    return SurvivalCurve(times[keep], values[keep], samples)


def predicted_survival(
    primary: SurvivalCurve, backup: SurvivalCurve, hedge_after_s: float, x_s: np.ndarray | float
) -> np.ndarray:
    """``P(call TTFT > x)`` for a call hedged at ``hedge_after_s`` (see the module docstring).

    Args:
        primary: ``S``, the primary's TTFT survival from the call's start.
        backup: ``G``, the backup's TTFT survival from its own send.
        hedge_after_s: the threshold ``t``, seconds.
        x_s: times, seconds, any shape.

    Returns:
        ``S(x)`` for ``x < t`` and ``S(x) * G(x - t)`` for ``x >= t``, shape of ``x_s``.
    """
    x = np.asarray(x_s, dtype=float)
    return primary(x) * np.where(x >= hedge_after_s, backup(x - hedge_after_s), 1.0)


@dataclass(frozen=True, slots=True)
class BucketReplay:
    """The primary samples of a window in arrival order, to replay the client's hedge bucket.

    Attributes:
        durations_s: primary durations, seconds, shape (n,), in the calls' arrival order.
        censored: shape (n,), True where the duration is a censoring time.
        budget: tokens each call deposits (the route's hedge budget), in (0, 1).
        burst: the bucket's capacity, tokens (the client's ``HedgePolicy.budget_burst``).
    """

    durations_s: np.ndarray
    censored: np.ndarray
    budget: float
    burst: float
    #: replays already run, by thresholds: ``(primary, index, denied)`` (a decision asks for the
    #: same current and proposed values at each level of its tail band)
    _runs: dict[bytes, tuple[SurvivalCurve, np.ndarray, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )


#: Up to this many thresholds :func:`_run_replay` moves the tokens in plain floats, one threshold
#: at a time (numpy's per-call overhead is larger than the work on a few thresholds); above it,
#: all thresholds at once in numpy. Both do the same IEEE operations in the same order.
_SCALAR_REPLAY = 4


def _replay_active(
    primary: SurvivalCurve, replay: BucketReplay, thresholds_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_run_replay`, once per thresholds and primary curve for one ``replay``."""
    key = np.asarray(thresholds_s, dtype=float).tobytes()
    run = replay._runs.get(key)
    if run is None or run[0] is not primary:
        run = (primary, *_run_replay(primary, replay, thresholds_s))
        replay._runs[key] = run
    return run[1], run[2]


def _run_replay(
    primary: SurvivalCurve, replay: BucketReplay, thresholds_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The bucket replay of ``denial_probabilities``, on the calls that can want a hedge.

    Returns:
        ``(index, denied)``: the indices (arrival order) of the calls whose want is not 0 for
        every threshold (a duration ``>=`` the smallest threshold, or censored), shape (a,),
        and their denied wants, shape (a, k). Between two such calls only deposits happen, so
        they are added in one step (``min(burst, tokens + m * budget)``).
    """
    t = np.asarray(thresholds_s, dtype=float)
    durations, censored = replay.durations_s, replay.censored
    index = np.flatnonzero((durations >= t.min()) | censored)
    active, cut = durations[index], censored[index]
    # every want up front, (a, k): the loop below then only moves tokens (4 in-place ufuncs a
    # call instead of building its want, grant and denial anew: the same operations in the
    # same order, so the same bits)
    waiting = active[:, None] >= t
    want = waiting.astype(float)
    if cut.any():
        s_d = np.maximum(primary(active[cut]), 1e-300)
        want[cut] = np.where(waiting[cut], 1.0, np.minimum(1.0, primary(t) / s_d[:, None]))
    deposits = replay.budget * np.diff(index, prepend=-1)  # the calls since the previous one's
    burst = float(replay.burst)
    if t.size <= _SCALAR_REPLAY:  # a few thresholds: one plain-float loop each (the same IEEE operations)
        granted = np.empty(want.shape, dtype=bool)
        steps = deposits.tolist()
        for column, wants in enumerate(want.T.tolist()):
            tokens, grants = burst, []
            for deposit, wanted in zip(steps, wants, strict=True):
                tokens = min(tokens + deposit, burst)
                grants.append(tokens >= wanted)
                if tokens >= wanted:
                    tokens -= wanted
            granted[:, column] = grants
        return index, np.where(granted, 0.0, want)
    tokens_all = np.full(t.size, burst)
    granted = np.empty(want.shape, dtype=bool)
    for deposit, wanted, grant in zip(deposits.tolist(), want, granted, strict=True):
        np.add(tokens_all, deposit, out=tokens_all)
        np.minimum(tokens_all, burst, out=tokens_all)
        np.greater_equal(tokens_all, wanted, out=grant)
        np.subtract(tokens_all, wanted, out=tokens_all, where=grant)
    return index, np.where(granted, 0.0, want)


def denial_probabilities(primary: SurvivalCurve, replay: BucketReplay, thresholds_s: np.ndarray) -> np.ndarray:
    """Replay the token bucket over the window's calls for each candidate threshold.

    Call ``i`` wants a hedge at ``t`` with probability ``w_i(t)``: 1 if its primary had no first
    token by ``t`` (an observed TTFT or a censoring time ``>= t``), 0 if it had one, and
    ``S(t) / S(c_i)`` when it was censored at ``c_i < t`` (its fate at ``t`` is unknown). The
    bucket (capacity ``burst``, full at the start) gets ``budget`` per call; a want is granted
    when the bucket holds at least ``w_i`` tokens (a fluid version of the client's "at least
    one token"), else it is denied. Cost: O(a * k) time and memory for the ``a`` calls that can
    want a hedge (about the budget's share of ``n``).

    Args:
        primary: ``S``, used for the censored calls' wants.
        replay: the calls in arrival order and the bucket.
        thresholds_s: candidate thresholds, seconds, shape (k,).

    Returns:
        Shape (n, k): the denied part of each call's want for each threshold (0 when granted or
        not wanted).
    """
    t = np.asarray(thresholds_s, dtype=float).ravel()
    index, denied = _replay_active(primary, replay, t)
    dense = np.zeros((replay.durations_s.size, t.size))
    dense[index] = denied
    return dense


def predicted_quantiles(
    primary: SurvivalCurve,
    backup: SurvivalCurve,
    thresholds_s: np.ndarray,
    q: float = 0.99,
    replay: BucketReplay | None = None,
) -> np.ndarray:
    """The call-TTFT quantile ``q`` predicted for each candidate threshold (vectorized).

    :func:`predicted_quantile_levels` at the one level ``q``.

    Returns:
        Shape (k,), seconds; ``inf`` where the predicted survival never drops to ``1 - q``.

    Raises:
        ValueError: ``q`` outside (0, 1).
    """
    best: np.ndarray = predicted_quantile_levels(primary, backup, thresholds_s, (q,), replay)[0]
    return best


def predicted_quantile_levels(
    primary: SurvivalCurve,
    backup: SurvivalCurve,
    thresholds_s: np.ndarray,
    qs: Sequence[float],
    replay: BucketReplay | None = None,
) -> np.ndarray:
    """The call-TTFT quantiles ``qs`` predicted for each candidate threshold (vectorized).

    The predicted survival is a step function that can only step down at a time where ``S``
    steps or at ``t`` plus a time where ``G`` steps, so the quantile (the smallest ``x`` with
    ``P(T > x) <= 1 - q``) is the smallest such candidate time that qualifies. Only candidates
    between the smallest threshold and ``x_max``, the first time ``S`` itself is ``<= 1 - q``,
    can be that smallest one (before the threshold ``P = S``; ``P <= S`` everywhere), so the
    others are not evaluated. Every level is read off one evaluation of the predicted survival
    at the candidates of the highest level (the largest ``x_max``) plus each level's own
    ``x_max``: a lower level's quantile lies at or below its ``x_max`` and every candidate there
    is in that set, so each level gets the value a separate call would give, to the bit.

    The candidates are not all evaluated: per threshold, ``_tail_search.first_at_or_below``
    searches the first one (of ``S``'s steps, then of ``t`` plus ``G``'s) where the survival
    without the replay, non-increasing and never above the replayed one, reaches the highest
    level, and evaluates the replayed survival from there on until each level's first
    qualifying candidate; the skipped candidates cannot qualify, so the result is the full
    evaluation's to the bit (``tests/controller/policy/test_tail_search.py``). At 96 thresholds
    and ~800 ``S`` and ~500 ``G`` steps (a route of 1,000 calls) that is ~1.1 ms instead of
    ~3.5 ms for the full evaluation (this machine, ``bench/controller_tick.py``'s routes).

    With ``replay``, a hedge the bucket would deny is not sent: for ``x >= t`` the backup's
    factor ``G(x - t)`` becomes ``(1 - d) * G(x - t) + d``, ``d`` the share of denied hedges
    among the calls still waiting at ``x`` (duration ``>= x``; see ``denial_probabilities``).

    Args:
        primary: ``S``.
        backup: ``G``.
        thresholds_s: candidate thresholds ``t``, seconds, shape (k,).
        qs: the quantile levels, each in (0, 1) (0.99: P99), shape (m,).
        replay: the window's calls in arrival order and the client's bucket, or None (every
            wanted hedge is sent).

    Returns:
        Shape (m, k), seconds; ``inf`` where the predicted survival never drops to ``1 - q``
        (the tail is not identified, e.g. too much censoring).

    Raises:
        ValueError: no level, or a level outside (0, 1).
    """
    if not qs or not all(0 < q < 1 for q in qs):
        raise ValueError(f"each q must be in (0, 1), got {tuple(qs)!r}")
    t = np.asarray(thresholds_s, dtype=float).reshape(-1, 1)
    levels = [1.0 - q + 1e-12 for q in qs]
    t_min = float(t.min()) if t.size else 0.0
    x_maxes = []
    for level in levels:
        low = np.flatnonzero(primary.values <= level)
        x_maxes.append(float(primary.times_s[low[0]]) if low.size else np.inf)
    x_max = max(x_maxes)
    s_times = primary.times_s[(primary.times_s >= t_min) & (primary.times_s <= x_max)]
    finite = [x for x in x_maxes if math.isfinite(x)]
    if finite:
        s_times = np.union1d(s_times, finite)
    share = None
    if replay is not None and replay.durations_s.size:
        index, denied = _replay_active(primary, replay, t.ravel())
        all_sorted = np.sort(replay.durations_s)
        active_s = replay.durations_s[index]
        keep = active_s >= t_min  # only these can be in a risk set at x >= t_min
        order = np.argsort(active_s[keep], kind="stable")
        sub_sorted = active_s[keep][order]
        sub_denied = denied[keep][order]
        # (k, a + 1): per threshold, the denied wants of the kept calls from each one on
        suffix = np.vstack([np.cumsum(sub_denied[::-1], axis=0)[::-1], np.zeros((1, t.shape[0]))]).T
        # the kept calls shorter than x, from the number p of all calls shorter than x: those
        # up to the p-th shortest of all (the kept ones are some of them), one search per call
        kept_below = np.searchsorted(sub_sorted, np.concatenate(([-np.inf], all_sorted)), side="right")

        def share(rows: np.ndarray, x: np.ndarray) -> np.ndarray:
            """``d`` at ``x`` (q, p) for the thresholds ``t[rows]`` (q,)."""
            x = np.minimum(x, all_sorted[-1])  # beyond the last sample the risk set is empty: the last one's
            below = np.searchsorted(all_sorted, x, side="left")
            denied_share: np.ndarray = suffix[rows[:, None], kept_below[below]] / (all_sorted.size - below)
            return denied_share  # at risk >= 1

    k = t.shape[0]
    # S's step times are candidates for every threshold alike. A backup step b with
    # t + b >= x_max puts that threshold's candidate at x_max, one of S's already (x_max is in
    # s_times when finite): only the steps before it are candidates of its own.
    g_steps = backup.times_s if math.isinf(x_max) else backup.times_s[t_min + backup.times_s < x_max]
    g_times = t + g_steps  # (k, g), each row ascending
    g_lengths = (g_times < x_max).sum(axis=1)

    def survival(rows: np.ndarray, x: np.ndarray, replayed: bool) -> np.ndarray:
        """The predicted survival at ``x`` (q, p) for the thresholds ``t[rows]`` (q,); without
        ``replayed``, the bound that leaves the bucket out (every wanted hedge sent)."""
        at = t[rows]
        hedged = backup(x - at)
        if replayed and share is not None:
            d = share(rows, x)
            hedged = (1.0 - d) * hedged + d
        out: np.ndarray = primary(x) * np.where(x >= at, hedged, 1.0)
        return out

    def s_at(rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        out: np.ndarray = s_times[pos]
        return out

    def g_at(rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        out: np.ndarray = g_times[rows[:, None], pos]
        return out

    def through(at: Evaluate, replayed: bool) -> Evaluate:
        return lambda rows, pos: survival(rows, at(rows, pos), replayed)

    best = np.full((len(levels), k), np.inf)
    for at, lengths in ((s_at, np.full(k, s_times.size)), (g_at, g_lengths)):
        found = first_at_or_below(lengths, np.asarray(levels), at, through(at, False), through(at, True))
        best = np.minimum(best, found)
    return best


def win_probability(primary: SurvivalCurve, backup: SurvivalCurve, hedge_after_s: float) -> float | None:
    """Predicted chance that a backup sent at ``t`` produces the first token before the primary.

    ``P(B < T - t | T > t) = E_B[S(t + B)] / S(t)`` with ``B ~ G`` independent of the primary's
    ``T``. ``G``'s mass beyond its last observation is counted at ``S``'s last value (the least
    ``S`` can be there), so the figure is a lower bound when ``G`` is not identified to the end.

    Returns:
        The probability, or None when ``S(t) = 0`` (no primary is still waiting at ``t``).
    """
    s_t = float(primary(hedge_after_s))
    if s_t <= 0:
        return None
    g = np.concatenate([[1.0], backup.values])
    mass = g[:-1] - g[1:]  # P(B = y_j)
    expected = float(np.sum(mass * primary(hedge_after_s + backup.times_s)))
    expected += backup.last_value * primary.last_value
    return min(1.0, expected / s_t)


@dataclass(frozen=True, slots=True)
class EfficientChoice:
    """The outcome of ``efficient_threshold``; every time in seconds.

    Attributes:
        hedge_after_s: the chosen threshold (``>= budget_target_s``).
        budget_target_s: the budget target it started from.
        p99_at_budget_s: predicted call P99 when hedging at the budget target (``inf``: not
            identified).
        p99_at_choice_s: predicted call P99 at the chosen threshold.
        min_p99_s: the smallest predicted P99 over the grid.
        win_probability_at_budget / win_probability_at_choice: predicted backup win chance of a
            hedge at either threshold (None where ``S(t) = 0``).
        grid_points: number of candidate thresholds evaluated.
        backup_source: ``"backup"`` when ``G`` came from backup samples, ``"primary"`` when
            ``S`` stood in for it.
        bucket_limited: True when the budget target's predicted P99 is more than the tolerance
            above the smallest (the bucket would run dry there); the choice is then the
            smallest threshold with the smallest predicted P99, not the largest within the
            tolerance.
    """

    hedge_after_s: float
    budget_target_s: float
    p99_at_budget_s: float
    p99_at_choice_s: float
    min_p99_s: float
    win_probability_at_budget: float | None
    win_probability_at_choice: float | None
    grid_points: int
    backup_source: str
    bucket_limited: bool = False


def efficient_threshold(
    primary: SurvivalCurve,
    backup: SurvivalCurve | None,
    budget_target_s: float,
    max_hedge_after_s: float,
    *,
    tolerance: float,
    grid_points: int = 96,
    q: float = 0.99,
    replay: BucketReplay | None = None,
) -> EfficientChoice:
    """The largest threshold ``>= budget_target_s`` whose predicted P99 is near the best one.

    Args:
        primary: ``S``.
        backup: ``G``; None to use ``S`` in its place (too few backup samples).
        budget_target_s: the budget rule's target, seconds (the floor of the search).
        max_hedge_after_s: the route's max clamp, seconds (the top of the search).
        tolerance: relative slack, >= 0: a candidate qualifies when its predicted P99 is at most
            ``(1 + tolerance) *`` the grid's smallest predicted P99.
        grid_points: candidates, geometric between the two ends (the budget target included).
        q: the quantile level (0.99).
        replay: the window's primary samples in arrival order and the client's bucket; when
            given, hedges the bucket would have denied at each candidate are part of the
            prediction (see ``predicted_quantiles``).

    Returns:
        An ``EfficientChoice``; its ``hedge_after_s`` is ``budget_target_s`` when no larger
        candidate qualifies or the predicted P99 is nowhere identified. When the budget
        target's predicted P99 exceeds ``(1 + tolerance) *`` the smallest (``bucket_limited``),
        it is the smallest candidate whose predicted P99 equals the smallest (see the module
        docstring: the tolerance is not spent upwards where the replay overrates high
        thresholds).

    Raises:
        ValueError: a non-positive target, ``tolerance < 0`` or ``grid_points < 2``.
    """
    if not (math.isfinite(budget_target_s) and budget_target_s > 0):
        raise ValueError(f"budget_target_s must be a finite number > 0, got {budget_target_s!r}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if grid_points < 2:
        raise ValueError(f"grid_points must be >= 2, got {grid_points!r}")
    source = "backup" if backup is not None else "primary"
    g = backup if backup is not None else primary
    top = max(max_hedge_after_s, budget_target_s)
    grid = np.geomspace(budget_target_s, top, grid_points) if top > budget_target_s else np.array([budget_target_s])
    p99 = predicted_quantiles(primary, g, grid, q, replay)
    best = float(p99.min())
    bucket_limited = False
    if math.isfinite(best):
        limit = best * (1.0 + tolerance) + 1e-12
        bucket_limited = bool(p99[0] > limit)
        if bucket_limited:
            chosen = int(np.flatnonzero(p99 <= best + 1e-12)[0])
        else:
            chosen = int(np.flatnonzero(p99 <= limit)[-1])
    else:
        chosen = 0
    choice = float(grid[chosen])
    return EfficientChoice(
        hedge_after_s=choice,
        budget_target_s=float(budget_target_s),
        p99_at_budget_s=float(p99[0]),
        p99_at_choice_s=float(p99[chosen]),
        min_p99_s=best,
        win_probability_at_budget=win_probability(primary, g, budget_target_s),
        win_probability_at_choice=win_probability(primary, g, choice),
        grid_points=int(grid.size),
        backup_source=source,
        bucket_limited=bucket_limited,
    )
