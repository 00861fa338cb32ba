"""The workload and the measures of ``bench/controller_eval.py``'s trace suite.

The workload is the Azure conversation trace, re-timed and cut (``load_workload``); each way's
figures over its runs are ``summarize_way`` (TTFT quantiles, hedge rates, the worst trailing
5-minute hedge rate of ``trailing_rates``, wasted tokens); ``grid_values`` and
``choose_best_fixed`` find the best fixed threshold in hindsight. The targets' constants are here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hedgerow.sim.trace import TraceRequest, compress, load_azure_trace
from hedgerow.sim.virtual import VirtualCall

__all__ = [
    "MIN_WINDOW_CALLS",
    "P99_TARGET_FACTOR",
    "RATE_STEP_S",
    "RATE_TARGET_FACTOR",
    "RATE_WINDOW_S",
    "WayResult",
    "choose_best_fixed",
    "grid_values",
    "load_workload",
    "summarize_way",
    "trailing_rates",
]

#: Length of the hedge-rate windows of the targets, seconds.
RATE_WINDOW_S = 300.0
#: Step at which trailing windows are evaluated, seconds.
RATE_STEP_S = 10.0
#: Fewest calls in a window for its hedge rate to count (the policy's SHORT_WINDOW_MIN_CALLS).
MIN_WINDOW_CALLS = 20
#: Slack of the 5-minute hedge-rate target (1.25 x budget) and of the P99 target (1.10 x).
RATE_TARGET_FACTOR = 1.25
P99_TARGET_FACTOR = 1.10


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


@dataclass(slots=True)
class WayResult:
    """One way's figures (after warm-up) and its calls, over one run per seed.

    Attributes:
        way: ``none``, ``fixed``, ``best_fixed``, ``adaptive`` (or ``grid`` for a candidate).
        hedge_after_s: the fixed value, None for ``none`` and ``adaptive``.
        summary: the JSON-ready figures (see ``summarize_way``).
        runs: the calls of each run (one list per seed, the first seed first).
        history: the adaptive controller's ticks of the first seed's run (empty for other ways).
    """

    way: str
    hedge_after_s: float | None
    summary: dict[str, Any]
    runs: list[list[VirtualCall]] = field(repr=False)
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)


def load_workload(path: Path, duration_s: float | None, rate_per_s: float | None) -> list[TraceRequest]:
    """Read the trace, optionally re-time it to a mean rate and cut it to a duration.

    Args:
        path: the Azure trace CSV.
        duration_s: keep the requests arriving before this virtual time, seconds (None = all).
        rate_per_s: compress (or stretch) arrival times so that the mean rate is this many
            requests per second (None = as recorded, ~5.5 req/s).

    Returns:
        Requests sorted by arrival, the first at 0.

    Raises:
        TraceError: the file is missing or malformed.
        ValueError: a non-positive duration or rate, or no request left.
    """
    trace = load_azure_trace(path)
    if len(trace) < 2:
        raise ValueError(f"{path}: needs at least two requests, found {len(trace)}")
    if rate_per_s is not None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"--rate must be a number > 0, got {rate_per_s!r}")
        native = (len(trace) - 1) / trace[-1].arrival_s
        trace = compress(trace, trace[-1].arrival_s * native / rate_per_s)
    if duration_s is not None:
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"--duration must be a number > 0, got {duration_s!r}")
        trace = [r for r in trace if r.arrival_s < duration_s]
    if len(trace) < 2:
        raise ValueError("the workload has fewer than two requests; lengthen --duration")
    return trace


def trailing_rates(
    calls: Sequence[VirtualCall],
    start_s: float,
    end_s: float,
    window_s: float = RATE_WINDOW_S,
    step_s: float = RATE_STEP_S,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hedge rates of trailing windows of calls (by arrival), evaluated every ``step_s``.

    Args:
        calls: the run's calls (any order).
        start_s: windows start at or after this time (the warm-up), seconds.
        end_s: last evaluation time, seconds.
        window_s: window length, seconds.
        step_s: evaluation step, seconds.

    Returns:
        ``(t_s, hedge_rate, wanted_rate)``, each of shape (k,): the window ends, the hedged
        fraction and the (hedged + denied) fraction; windows with fewer than
        ``MIN_WINDOW_CALLS`` calls are left out.
    """
    arrival = np.asarray([c.arrival_s for c in calls])
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    hedged = np.asarray([c.hedged for c in calls], dtype=float)[order]
    wanted = np.asarray([c.hedged or c.hedge_denied for c in calls], dtype=float)[order]
    cum_h = np.concatenate([[0.0], np.cumsum(hedged)])
    cum_w = np.concatenate([[0.0], np.cumsum(wanted)])
    ends = np.arange(start_s + window_s, end_s + 1e-9, step_s)
    lo = np.searchsorted(arrival, ends - window_s, side="left")
    hi = np.searchsorted(arrival, ends, side="left")
    n = hi - lo
    keep = n >= MIN_WINDOW_CALLS
    n, lo, hi, ends = n[keep], lo[keep], hi[keep], ends[keep]
    return ends, (cum_h[hi] - cum_h[lo]) / n, (cum_w[hi] - cum_w[lo]) / n


def summarize_way(runs: Sequence[Sequence[VirtualCall]], warmup_s: float, end_s: float) -> dict[str, Any]:
    """The figures of one way over the calls arriving at or after ``warmup_s``, pooled over runs.

    Args:
        runs: the calls of each run (one run per seed).
        warmup_s: calls arriving earlier are left out, seconds.
        end_s: the last arrival, seconds (end of the trailing windows).

    Quantiles and rates are over the pooled calls of every run; the worst window is the worst
    of any run.

    Returns:
        A dict with ``calls``, ``ttft_p50_s``, ``ttft_p90_s``, ``ttft_p99_s``, ``ttft_p999_s``,
        ``hedge_rate``, ``worst_window_hedge_rate`` (None when no window qualifies),
        ``wanted_hedge_rate``, ``worst_window_wanted_hedge_rate``, ``hedge_denied_rate``,
        ``backup_win_rate``, ``wasted_completion_tokens``, ``wasted_prefill_tokens``.
    """
    kept_runs = [[c for c in calls if c.arrival_s >= warmup_s] for calls in runs]
    kept = [c for calls in kept_runs for c in calls]
    if not kept:
        raise ValueError("no call arrives after the warm-up; shorten --warmup-s")
    ttft = np.asarray([c.ttft_s for c in kept], dtype=float)
    p50, p90, p99, p999 = (float(v) for v in np.percentile(ttft, [50, 90, 99, 99.9]))
    hedges = sum(c.hedged for c in kept)
    denied = sum(c.hedge_denied for c in kept)
    wins = sum(c.hedged and c.winner == "backup" for c in kept)
    windows = [trailing_rates(calls, warmup_s, end_s) for calls in kept_runs]
    rates = np.concatenate([w[1] for w in windows])
    wanted = np.concatenate([w[2] for w in windows])
    return {
        "calls": len(kept),
        "runs": len(kept_runs),
        "ttft_p50_s": p50,
        "ttft_p90_s": p90,
        "ttft_p99_s": p99,
        "ttft_p999_s": p999,
        "hedge_rate": hedges / len(kept),
        "worst_window_hedge_rate": float(rates.max()) if rates.size else None,
        "wanted_hedge_rate": (hedges + denied) / len(kept),
        "worst_window_wanted_hedge_rate": float(wanted.max()) if wanted.size else None,
        "hedge_denied_rate": denied / len(kept),
        "backup_win_rate": _rate(wins, hedges),
        "wasted_completion_tokens": int(sum(c.wasted_completion_tokens for c in kept)),
        "wasted_prefill_tokens": int(sum(c.wasted_prefill_tokens for c in kept)),
    }


def choose_best_fixed(candidates: Sequence[WayResult], budget: float) -> WayResult:
    """The candidate with the lowest TTFT P99 among those with ``hedge_rate <= budget``.

    Ties are broken by the lower hedge rate. When no candidate is within budget, the one with
    the lowest hedge rate is returned (so that the comparison is still made, and visible).

    Raises:
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("no fixed candidates to choose from")
    within = [c for c in candidates if c.summary["hedge_rate"] <= budget]
    if not within:
        return min(candidates, key=lambda c: c.summary["hedge_rate"])
    return min(within, key=lambda c: (c.summary["ttft_p99_s"], c.summary["hedge_rate"]))


def grid_values(none: WayResult, points: int, fixed_s: float) -> list[float]:
    """Geometric grid between the ``none`` way's TTFT P50 and P99.5, plus ``fixed_s``."""
    ttft = np.asarray([c.ttft_s for calls in none.runs for c in calls], dtype=float)
    low, high = (float(v) for v in np.percentile(ttft, [50, 99.5]))
    low = max(low, 0.01)
    high = max(high, low * 1.5)
    values = {round(float(v), 4) for v in np.geomspace(low, high, max(points, 2))}
    values.add(float(fixed_s))
    return sorted(values)
