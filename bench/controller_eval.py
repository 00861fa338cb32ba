"""Benchmark: how well the controller's thresholds hold the budget and cut the tail, in virtual time.

No HTTP and no store: the Azure LLM inference conversation trace (19,366 requests over 58 min,
5.5 req/s; ``../shared/data/traces/AzureLLMInferenceTrace_conv.csv``, loaded by
``hedgerow.sim.trace.load_azure_trace``) is replayed through simulated replicas in virtual time
(``hedgerow.sim.virtual``: the scheduling of ``hedgerow.sim.engine.ReplicaEngine``, i.e.
continuous batching with prefill pausing decode, on the Splitwise llama2-70b/H100/TP4 service
times; the client's hedging, token-bucket budget, first-token-wins and cancellation). Half way
through, one replica slows down ``--shift-factor`` (3x) times.

Cluster (defaults): 5 replicas with a batch bound of 64; primaries go to a replica chosen at
random (seeded), a backup to the next replica. At the trace's own rate the replicas are
moderately loaded; after the shift the slow replica takes a fifth of the calls at a third of its
speed and, in the trace's busiest 15 minutes (7.4 req/s), queues up: without hedging its calls
wait tens of seconds. Hedged calls whose backup wins cancel their primary, which also sheds load
from the slow replica.

Ways compared (each replays the same workload with the same seeds):

* ``none``: no hedging;
* ``fixed``: ``hedge_after_s`` = ``--fixed-s`` (2.0 s, the client's default);
* ``best_fixed``: the best fixed value in hindsight. A geometric grid of ``--grid`` values
  between the ``none`` way's TTFT P50 and P99.5 (plus ``--fixed-s``) is replayed, then
  ``--refine`` (4) values between the grid neighbours of the best one; among the
  values whose overall hedge rate (after warm-up) is at most the budget, the one with the lowest
  TTFT P99 wins (ties: the lower hedge rate). It is an oracle: it saw the whole run, shift
  included, and the minimum over a grid of noisy P99s is biased low (winner's curse);
* ``adaptive``: the controller's own code. Every ``controller_interval_s`` virtual seconds
  (``HEDGEROW_CONTROLLER_INTERVAL_S``, default 60) a tick gathers the records visible so far
  exactly like ``hedgerow.controller.jobs``: the primary TTFT samples of the calls started in
  the window (``HEDGEROW_WINDOW_S``, default 3600, doubled up to ``max_window_s`` while fewer
  than ``min_samples``), censored at the cancel time when the backup won, with their calls'
  arrival times (the order in which the policy replays the client's hedge bucket); the hedges'
  backup TTFT samples of the same window, from the backup's own send, censored when the primary
  won; the calls, hedges, wanted hedges (hedged or denied) and backup wins of that window and of
  the short window; the call-level TTFT P99 and the short window's own KM target; then
  ``estimate_ttft`` and ``decide`` (with ``PolicyKnobs.from_settings``; every ``HEDGEROW_*``
  knob applies, e.g. ``HEDGEROW_P99_TOLERANCE``) set the value that calls use from the next
  arrival on (clients are assumed to see a new threshold at once).

Every hedging way goes through the same token bucket as the real client
(``hedgerow.client.budget.HedgeBudget``, budget ``--budget``, burst ``--burst`` 10): a hedge the
bucket refuses is not sent (``hedge_denied``). The bucket counts calls, not time, so it needs no
clock. Since the bucket caps hedges at ``budget * calls + burst``, a 5-minute hedge rate can
only exceed the budget by ``burst`` hedges; the *wanted* hedge rate (hedged or denied: calls
whose threshold passed) shows what a threshold asks for without that cap.

Each way is run once per seed (``--seeds``, default 3; the seed picks the primaries). Measures
per way, over the calls of every run that arrive after the warm-up (``--warmup-s``, default
600 s), pooled: TTFT P50/P99/P99.9 (the winner's first token), hedge rate (calls with a backup /
calls), the worst hedge rate of any trailing 5-minute window of any run (by arrival, evaluated
every 10 s, windows starting after the warm-up and holding at least 20 calls), the wanted hedge
rate, and the wasted work of the losers: completion tokens generated before the abort took
effect (the client cancels at the winner's first token, the replica aborts 20 ms later) and
prompt tokens whose prefill had started.

Targets (issue 4): adaptive keeps every post-warm-up 5-minute hedge rate <= 1.25 x budget, and
its P99 is within 10% of the best fixed value's at no more hedging (overall hedge rate <= the
best fixed value's).

Scenario suite (``--suite scenarios``, issue 11): generated workloads that reproduce each known
failure of the old rule stack (``bench/controller_scenarios.py``: rare slow mode, clients
hedging below the default on a cold route, heavy tail near the budget, small windows, few
calls, a 2x slowdown and back, ties), scored per phase against the generating distributions:
ticks over budget (and those of the cold period, before the objective's first decision), P99
regret against the hindsight-best threshold within budget, changes per hour at steady state,
clamp values published and whether they were labelled; the "Done when" targets of the issue
are printed MET / NOT MET with their figures. Both suites drive the same ``VirtualController``,
whose tick builds ``WindowRecords`` and runs ``hedgerow.controller.policy._policy_window.observe_window``
and ``decide``: the code of the live tick. With ``--minutes`` the records reach those rules as
the live tick reads them from the store (``hedgerow.controller.store._minute_window.tick_window``):
minute aggregates (each duration at its bucket's end, each start in its minute) before
``raw_since(now)``, the calls one by one after it.

Run: ``python bench/controller_eval.py [--suite trace|scenarios] [--scenario NAME] [--json FILE]
[--out-dir bench/results] [--duration S] [--rate R] [--budget B] [--seed N] [--seeds K]
[--window-s S] [--interval-s S] [--minutes]``. Prints a table and whether each target is met,
writes JSON (``--json``, default
``OUT_DIR/controller_eval.json``) and ``OUT_DIR/controller_eval.png`` (the adaptive threshold,
the 5-minute hedge rates and the 5-minute TTFT P99 over time, first seed). Not a test: nothing is
asserted; exits 2 with a message when the trace file is absent or an option is out of range.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hedgerow.controller.policy._policy_window import WindowData, WindowRecords, observe_window
from hedgerow.controller.policy.policy import PolicyKnobs, RouteConfig, decide
from hedgerow.controller.store._minute_window import minutes_of, raw_since, tick_window
from hedgerow.settings import Settings
from hedgerow.sim.perf_model import load_perf_model
from hedgerow.sim.trace import TraceError, TraceRequest, compress, load_azure_trace
from hedgerow.sim.virtual import ClusterConfig, VirtualCall, simulate

__all__ = [
    "DEFAULT_TRACE",
    "VirtualController",
    "WayResult",
    "choose_best_fixed",
    "load_workload",
    "main",
    "run_evaluation",
    "summarize_way",
    "trailing_rates",
]

#: The Azure conversation trace, relative to the repository root (and to the working directory).
DEFAULT_TRACE = Path("..") / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
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


class VirtualController:
    """The controller job in virtual time: gathers samples like ``controller.jobs``, then decides.

    Args:
        config: the route's configuration (budget, default/min/max ``hedge_after_s``).
        settings: windows, ``min_samples``, ``confidence`` and the policy knobs.
        minutes: give the rules the calls as the live tick reads them
            (``_minute_window.tick_window``: minute aggregates, durations to their bucket and
            starts to their minute, before ``raw_since(now)``; the calls after it as they are),
            instead of one entry per call.

    Attributes:
        current: the published ``hedge_after_s`` (None before the first publication).
        source: the published value's source (``Decision.source``; None before the first
            publication), passed to ``decide`` as ``controller.jobs`` passes ``thresholds.source``.
        history: one dict per tick: ``t_s``, ``hedge_after_s``, ``reason``, ``samples``,
            ``censored``, ``window_s``, ``p90_s``, ``p99_s``, ``target_s``,
            ``observed_hedge_rate``, ``short_window_hedge_rate``, ``backup_win_rate``.
    """

    def __init__(self, config: RouteConfig, settings: Settings, *, minutes: bool = False) -> None:
        self.config = config
        self.settings = settings
        self.minutes = minutes
        self.knobs = PolicyKnobs.from_settings(settings)
        self.current: float | None = None
        self.source: str | None = None
        self.history: list[dict[str, Any]] = []
        self._seen = 0
        self._arrival: list[float] = []
        self._duration: list[float] = []
        self._censored: list[bool] = []
        self._hedged: list[bool] = []
        self._backup_won: list[bool] = []
        self._denied: list[bool] = []
        self._backup_duration: list[float] = []  # NaN without a backup
        self._backup_censored: list[bool] = []
        self._ttft: list[float] = []

    def threshold(self, _now: float) -> float:
        """The ``hedge_after_s`` a client uses now: the published value, else the default."""
        return self.config.default_hedge_after_s if self.current is None else self.current

    def _absorb(self, visible: Sequence[VirtualCall]) -> None:
        for call in visible[self._seen :]:
            assert call.primary_ttft_s is not None
            self._arrival.append(call.arrival_s)
            self._duration.append(call.primary_ttft_s)
            self._censored.append(call.primary_censored)
            self._hedged.append(call.hedged)
            self._backup_won.append(call.hedged and call.winner == "backup")
            self._denied.append(call.hedge_denied)
            backup_s = call.backup_ttft_s if call.hedged else None
            self._backup_duration.append(math.nan if backup_s is None else backup_s)
            self._backup_censored.append(call.backup_censored)
            self._ttft.append(call.ttft_s if call.ttft_s is not None else math.nan)
        self._seen = len(visible)

    def tick(self, now: float, visible: Sequence[Any]) -> None:
        """One tick at virtual time ``now`` over the records visible so far (see the module doc).

        The records become ``WindowRecords`` and go through ``observe_window`` and ``decide``,
        the code ``hedgerow.controller.jobs`` runs on the store's records.
        """
        self._absorb(visible)
        arrival = np.asarray(self._arrival, dtype=float)
        keep = arrival > now - max(self.settings.max_window_s, self.settings.window_s)
        hedged = np.asarray(self._hedged, dtype=bool)[keep]
        records = WindowRecords(
            age_s=now - arrival[keep],
            primary_s=np.asarray(self._duration, dtype=float)[keep],
            primary_censored=np.asarray(self._censored, dtype=bool)[keep],
            hedged=hedged,
            backup_won=np.asarray(self._backup_won, dtype=bool)[keep],
            denied=np.asarray(self._denied, dtype=bool)[keep],
            backup_s=np.asarray(self._backup_duration, dtype=float)[keep],
            backup_censored=np.asarray(self._backup_censored, dtype=bool)[keep],
            call_ttft_s=np.asarray(self._ttft, dtype=float)[keep],
        )
        budget = self.config.budget if 0.0 < self.config.budget < 1.0 else None
        data: WindowRecords | WindowData = records
        if self.minutes:
            at = datetime.fromtimestamp(now, UTC)
            recent = records.age_s <= now - raw_since(at).timestamp()
            data = tick_window(minutes_of(records.select(~recent), at), records.select(recent), at)
        observation = observe_window(data, settings=self.settings, budget=budget, knobs=self.knobs)
        estimate = observation.estimate
        window = observation.window_s
        decision = decide(self.config, self.current, observation, self.knobs, current_source=self.source)
        self.current = decision.hedge_after_s
        self.source = decision.source
        self.history.append(
            {
                "t_s": now,
                "hedge_after_s": decision.hedge_after_s,
                "applied": decision.applied,
                "reason": decision.reason,
                "samples": 0 if estimate is None else estimate.samples,
                "censored": 0 if estimate is None else estimate.censored,
                "window_s": window,
                "p90_s": None if estimate is None else estimate.p90_s,
                "p99_s": None if estimate is None else estimate.p99_s,
                "target_s": None if estimate is None else estimate.target_s,
                "observed_hedge_rate": observation.observed_hedge_rate,
                "short_window_hedge_rate": observation.short_window_hedge_rate,
                "short_window_wanted_rate": observation.short_window_wanted_rate,
                "short_window_target_s": observation.short_window_target_s,
                "backup_win_rate": observation.backup_win_rate,
                "details": decision.details or None,
            }
        )


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


def _grid(none: WayResult, points: int, fixed_s: float) -> list[float]:
    """Geometric grid between the ``none`` way's TTFT P50 and P99.5, plus ``fixed_s``."""
    ttft = np.asarray([c.ttft_s for calls in none.runs for c in calls], dtype=float)
    low, high = (float(v) for v in np.percentile(ttft, [50, 99.5]))
    low = max(low, 0.01)
    high = max(high, low * 1.5)
    values = {round(float(v), 4) for v in np.geomspace(low, high, max(points, 2))}
    values.add(float(fixed_s))
    return sorted(values)


def run_evaluation(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    """Run every way; return the JSON-ready results (see the module docstring).

    Args:
        args: the parsed command line (see ``_parser``).
        progress: a callable ``progress(message)`` for progress lines, or None.

    Raises:
        TraceError: the trace is missing or malformed.
        ValueError: an option out of range.
    """
    say = progress or (lambda _msg: None)
    workload = load_workload(args.trace, args.duration, args.rate)
    span_s = workload[-1].arrival_s
    shift_at_s = span_s / 2 if args.shift_at_s is None else args.shift_at_s
    warmup_s = min(600.0, 0.2 * span_s) if args.warmup_s is None else args.warmup_s
    if not 0 <= warmup_s < span_s:
        raise ValueError(f"--warmup-s must be in [0, {span_s:.0f}) (the workload's span), got {warmup_s}")
    overrides: dict[str, Any] = {}
    if args.interval_s is not None:
        overrides["controller_interval_s"] = args.interval_s
    if args.window_s is not None:
        overrides["window_s"] = args.window_s
    settings = Settings(**overrides)
    route = RouteConfig(
        budget=args.budget,
        default_hedge_after_s=settings.default_hedge_after_s,
        min_hedge_after_s=settings.min_hedge_after_s,
        max_hedge_after_s=settings.max_hedge_after_s,
    )
    cluster = ClusterConfig(
        replicas=args.replicas,
        max_batch=args.max_batch,
        shift_at_s=shift_at_s,
        shift_factor=args.shift_factor,
        budget=args.budget,
        budget_burst=args.burst,
        seed=args.seed,
    )
    perf = load_perf_model()

    seeds = [args.seed + k for k in range(args.seeds)]

    def cluster_for(seed: int) -> ClusterConfig:
        return dataclasses.replace(cluster, seed=seed)

    def fixed_way(way: str, value: float | None) -> WayResult:
        runs = [simulate(workload, perf, cluster_for(seed), threshold=value).calls for seed in seeds]
        return WayResult(way, value, summarize_way(runs, warmup_s, span_s), runs)

    say(f"workload: {len(workload)} requests over {span_s:.0f} s, shift at {shift_at_s:.0f} s")
    none = fixed_way("none", None)
    fixed = fixed_way("fixed", args.fixed_s)
    grid_values = _grid(none, args.grid, args.fixed_s)
    say(f"grid of {len(grid_values)} fixed values: {', '.join(f'{v:g}' for v in grid_values)}")
    candidates: list[WayResult] = []
    best: WayResult | None = None

    def try_values(values: Sequence[float]) -> None:
        nonlocal best
        for value in values:
            candidate = fixed if value == args.fixed_s else fixed_way("grid", value)
            leader = choose_best_fixed([c for c in (best, candidate) if c is not None], args.budget)
            loser = candidate if leader is not candidate else best
            if loser is not None and loser is not fixed:
                loser.runs = []  # only the figures of a losing candidate are kept (memory)
            best = leader
            candidates.append(candidate)

    try_values(grid_values)
    assert best is not None and best.hedge_after_s is not None
    # refine: geometric points between the best value's neighbours on the grid
    i = grid_values.index(best.hedge_after_s)
    low = grid_values[max(i - 1, 0)]
    high = grid_values[min(i + 1, len(grid_values) - 1)]
    refined = sorted({round(float(v), 4) for v in np.geomspace(low, high, args.refine + 2)[1:-1]} - set(grid_values))
    if refined:
        say(f"refined around {best.hedge_after_s:g} s: {', '.join(f'{v:g}' for v in refined)}")
        try_values(refined)
    candidates.sort(key=lambda c: c.hedge_after_s or 0.0)
    best = choose_best_fixed(candidates, args.budget)
    best_fixed = WayResult("best_fixed", best.hedge_after_s, best.summary, best.runs)
    say("adaptive")
    runs, histories = [], []
    for seed in seeds:
        controller = VirtualController(route, settings, minutes=args.minutes)
        result = simulate(
            workload,
            perf,
            cluster_for(seed),
            threshold=controller.threshold,
            tick=controller.tick,
            tick_interval_s=settings.controller_interval_s,
        )
        runs.append(result.calls)
        histories.append(controller.history)
    adaptive = WayResult("adaptive", None, summarize_way(runs, warmup_s, span_s), runs, histories[0])
    ways = [none, fixed, best_fixed, adaptive]

    budget = args.budget
    a, b = adaptive.summary, best_fixed.summary
    worst = a["worst_window_hedge_rate"]
    targets = {
        "window_rate": {
            "met": worst is not None and worst <= RATE_TARGET_FACTOR * budget,
            "worst_window_hedge_rate": worst,
            "limit": RATE_TARGET_FACTOR * budget,
        },
        "p99_vs_best_fixed": {
            "met": a["ttft_p99_s"] <= P99_TARGET_FACTOR * b["ttft_p99_s"] and a["hedge_rate"] <= b["hedge_rate"],
            "adaptive_p99_s": a["ttft_p99_s"],
            "limit_p99_s": P99_TARGET_FACTOR * b["ttft_p99_s"],
            "adaptive_hedge_rate": a["hedge_rate"],
            "best_fixed_hedge_rate": b["hedge_rate"],
        },
    }
    return {
        "benchmark": "controller_eval",
        "budget": budget,
        "ways": [{"way": w.way, "hedge_after_s": w.hedge_after_s, **w.summary} for w in ways],
        "targets": targets,
        "grid": [{"hedge_after_s": c.hedge_after_s, **c.summary} for c in candidates],
        "adaptive_final_hedge_after_s": [h[-1]["hedge_after_s"] if h else None for h in histories],
        "adaptive_history": adaptive.history,
        "config": {
            "minutes": args.minutes,
            "trace": str(args.trace),
            "requests": len(workload),
            "span_s": span_s,
            "rate_per_s": (len(workload) - 1) / span_s,
            "shift_at_s": shift_at_s,
            "shift_factor": args.shift_factor,
            "warmup_s": warmup_s,
            "replicas": args.replicas,
            "max_batch": args.max_batch,
            "budget_burst": args.burst,
            "seeds": seeds,
            "fixed_s": args.fixed_s,
            "balance": cluster.balance,
            "cancel_latency_s": cluster.cancel_latency_s,
            "export_delay_s": cluster.export_delay_s,
            "controller_interval_s": settings.controller_interval_s,
            "window_s": settings.window_s,
            "short_window_s": settings.short_window_s,
            "min_samples": settings.min_samples,
            "perf_model": perf.describe(),
        },
        "_ways": ways,  # removed before writing JSON; used by the plot
    }


def plot(results: dict[str, Any], path: Path) -> None:
    """Write the PNG: adaptive threshold, 5-minute hedge rates and 5-minute TTFT P99 over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ways: list[WayResult] = results["_ways"]
    config = results["config"]
    budget = results["budget"]
    shift_min = config["shift_at_s"] / 60
    warmup_s, span_s = config["warmup_s"], config["span_s"]
    colors = {"none": "tab:gray", "fixed": "tab:orange", "best_fixed": "tab:green", "adaptive": "tab:blue"}
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)

    ax = axes[0]
    history = ways[-1].history
    if history:
        tick_min = [0.0] + [h["t_s"] / 60 for h in history]
        v = [history[0]["hedge_after_s"]] + [h["hedge_after_s"] for h in history]
        ax.step(tick_min, v, where="post", color=colors["adaptive"], label="adaptive hedge_after_s")
        p90 = [(h["t_s"] / 60, h["p90_s"]) for h in history if h["p90_s"] is not None]
        if p90:
            ax.plot(*zip(*p90, strict=False), ".", ms=3, color="tab:purple", label="KM P90 of the window")
    for w in ways[1:3]:
        ax.axhline(w.hedge_after_s, color=colors[w.way], ls="--", lw=1, label=f"{w.way} {w.hedge_after_s:g} s")
    ax.set_yscale("log")
    ax.set_ylabel("hedge_after_s (s)")
    ax.set_title("adaptive threshold (published every controller tick)")

    ax = axes[1]
    for w in ways[1:]:
        t, rate, wanted = trailing_rates(w.runs[0], 0.0, span_s)
        ax.plot(t / 60, rate, color=colors[w.way], lw=1.5 if w.way == "adaptive" else 1, label=f"{w.way} hedge rate")
        if w.way == "adaptive":
            ax.plot(t / 60, wanted, color=colors[w.way], lw=0.8, ls=":", label="adaptive wanted (hedged + denied)")
    ax.axhline(budget, color="black", lw=1, label=f"budget {budget:g}")
    ax.axhline(RATE_TARGET_FACTOR * budget, color="red", lw=1, ls="--", label=f"target {RATE_TARGET_FACTOR:g} x budget")
    ax.set_ylabel("hedge rate, trailing 5 min")
    ax.set_title("hedge rate of the calls that arrived in the last 5 minutes")

    ax = axes[2]
    for w in ways:
        arrival = np.asarray([c.arrival_s for c in w.runs[0]])
        ttft = np.asarray([c.ttft_s for c in w.runs[0]], dtype=float)
        edges = np.arange(0.0, span_s + RATE_WINDOW_S, RATE_WINDOW_S)
        mids, p99 = [], []
        for lo, hi in itertools.pairwise(edges):
            sel = ttft[(arrival >= lo) & (arrival < hi)]
            if sel.size >= MIN_WINDOW_CALLS:
                mids.append((lo + hi) / 120)
                p99.append(float(np.percentile(sel, 99)))
        ax.plot(mids, p99, marker="o", ms=3, color=colors[w.way], label=w.way)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT P99 (s), per 5 min")
    ax.set_xlabel("virtual time (min)")
    ax.set_title("TTFT P99 of each 5-minute block of arrivals")

    for ax in axes:
        ax.axvline(shift_min, color="red", lw=1)
        ax.axvspan(0, warmup_s / 60, color="0.9", zorder=0)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[0].annotate(
        f"replica slows {config['shift_factor']:g}x",
        (shift_min, 1),
        xycoords=("data", "axes fraction"),
        xytext=(4, -12),
        textcoords="offset points",
        color="red",
        fontsize=8,
    )
    axes[0].annotate(
        "warm-up",
        (0, 1),
        xycoords="axes fraction",
        xytext=(4, -12),
        textcoords="offset points",
        color="0.4",
        fontsize=8,
    )
    fig.suptitle(
        f"controller evaluation: {config['requests']} requests of the Azure conv trace, "
        f"{config['replicas']} replicas, budget {budget:g} (run of seed {config['seeds'][0]})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(results: dict[str, Any], wall_s: float) -> None:
    """Print the ways and the targets as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=170)
    table = Table(
        title=f"controller evaluation (after warm-up of {results['config']['warmup_s']:.0f} s; "
        f"budget {results['budget']:g})"
    )
    for name in (
        "way",
        "hedge_after_s",
        "TTFT P50 s",
        "P99 s",
        "P99.9 s",
        "hedge rate",
        "worst 5-min",
        "wanted rate",
        "worst 5-min wanted",
        "wasted compl. tokens",
        "wasted prefill tokens",
    ):
        table.add_column(name, justify="left" if name == "way" else "right")
    for w in results["ways"]:
        table.add_row(
            w["way"],
            "adaptive" if w["way"] == "adaptive" else _fmt(w["hedge_after_s"], 3),
            _fmt(w["ttft_p50_s"]),
            _fmt(w["ttft_p99_s"]),
            _fmt(w["ttft_p999_s"]),
            _fmt(w["hedge_rate"], 4),
            _fmt(w["worst_window_hedge_rate"], 4),
            _fmt(w["wanted_hedge_rate"], 4),
            _fmt(w["worst_window_wanted_hedge_rate"], 4),
            str(w["wasted_completion_tokens"]),
            str(w["wasted_prefill_tokens"]),
        )
    console.print(table)
    t = results["targets"]
    w, p = t["window_rate"], t["p99_vs_best_fixed"]
    console.print(
        f"target 1 (every post-warm-up 5-min hedge rate <= {w['limit']:.4f}): "
        f"{'MET' if w['met'] else 'NOT MET'} (worst {_fmt(w['worst_window_hedge_rate'], 4)})"
    )
    console.print(
        f"target 2 (P99 <= {p['limit_p99_s']:.3f} s and hedge rate <= best fixed's "
        f"{p['best_fixed_hedge_rate']:.4f}): {'MET' if p['met'] else 'NOT MET'} "
        f"(adaptive P99 {p['adaptive_p99_s']:.3f} s, hedge rate {p['adaptive_hedge_rate']:.4f})"
    )
    console.print(f"wall time {wall_s:.1f} s")


def run_scenarios(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    """Run the generated-data scenarios of ``controller_scenarios`` through the controller.

    Each scenario runs once per seed (``--seeds``, from ``--seed``) with the same
    ``VirtualController`` as the trace suite; the figures are per (scenario, phase, seed); see
    ``bench/controller_scenarios.py`` for the scenarios, the truth and the metrics.

    Returns:
        JSON-ready results: ``rows`` (one per phase and seed), ``summary`` (the issue's targets,
        each with its figure and whether it is met) and the run's configuration.
    """
    from controller_scenarios import SCENARIOS, evaluate_scenario, make_truth, simulate_scenario

    say = progress or (lambda _msg: None)
    settings = Settings()
    wanted = set(args.scenario or [])
    rows: list[dict[str, Any]] = []
    ticks: dict[str, list[list[Any]]] = {}
    for scenario in SCENARIOS:
        if wanted and scenario.name not in wanted:
            continue
        truths = [make_truth(phase, scenario.budget) for phase in scenario.phases]
        route = RouteConfig(
            budget=scenario.budget,
            default_hedge_after_s=scenario.default_hedge_after_s,
            min_hedge_after_s=settings.min_hedge_after_s,
            max_hedge_after_s=settings.max_hedge_after_s,
        )
        for seed in range(args.seed, args.seed + args.seeds):
            started = time.perf_counter()
            controller = VirtualController(route, settings, minutes=args.minutes)
            calls = simulate_scenario(scenario, controller, seed, settings.controller_interval_s)
            for result in evaluate_scenario(
                scenario,
                controller.history,
                calls,
                truths,
                seed,
                settings.min_hedge_after_s,
                settings.max_hedge_after_s,
            ):
                rows.append(dataclasses.asdict(result))
            ticks[f"{scenario.name}/{seed}"] = [
                [h["t_s"], h["hedge_after_s"], h["reason"], h["window_s"], h["samples"]] for h in controller.history
            ]
            say(f"{scenario.name} seed {seed}: {len(calls)} calls, {time.perf_counter() - started:.1f} s")
    return {
        "benchmark": "controller_eval_scenarios",
        "minutes": args.minutes,
        "rows": rows,
        "summary": scenario_targets(rows),
        "ticks": ticks,  # per run: [t_s, hedge_after_s, reason, window_s, samples]
    }


def scenario_targets(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's "Done when" targets over the scenario rows, each with its figure and verdict."""
    regrets = [r["regret"] for r in rows]
    cold = [r for r in rows if r["phase"] in ("steady", "before")]
    slow = [r for r in rows if r["phase"] == "slow_2x"]
    recovered = [r for r in rows if r["phase"] == "recovered"]
    changes = [r["changes_per_hour"] for r in rows]
    worst_cold = max((r["ticks_over_budget"] for r in cold), default=0)
    worst_cold_period = max((r["cold_ticks_over_budget"] for r in cold), default=0)
    worst_slow = max((r["ticks_over_budget"] for r in slow), default=0)
    recover = [r["ticks_to_recover"] for r in recovered]
    worst_recover = None if any(v is None for v in recover) else max(recover, default=0)
    return {
        "settled_over_budget": {"value": sum(r["settled_over_budget"] for r in rows), "limit": 0},
        "regret_median": {"value": float(np.median(regrets)), "limit": 1.05},
        "regret_max": {"value": float(np.max(regrets)), "limit": 1.5},
        "ticks_over_budget_cold_start": {"value": worst_cold, "limit": 2},
        "ticks_over_budget_cold_period": {"value": worst_cold_period, "limit": 2},
        "ticks_over_budget_after_slowdown": {"value": worst_slow, "limit": 2},
        "ticks_to_recover_after_recovery": {"value": worst_recover, "limit": 5},
        "changes_per_hour_steady_max": {"value": float(np.max(changes)), "limit": 2},
        "unlabelled_clamps": {"value": sum(r["unlabelled_clamps"] for r in rows), "limit": 0},
    }


def print_scenarios(results: dict[str, Any]) -> None:
    """Print the scenario rows and the targets as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=260)
    table = Table(title="controller scenarios (generated data; truth from the generating distributions)")
    for name in (
        "scenario",
        "phase",
        "seed",
        "ticks",
        "over budget",
        "cold over",
        "settled over",
        "worst true rate",
        "settled s",
        "best s",
        "P99 s",
        "best P99 s",
        "regret",
        "changes/h",
        "hedge rate",
        "recover ticks",
        "clamps",
        "main reasons",
    ):
        table.add_column(
            name, justify="left" if name in ("scenario", "phase", "main reasons") else "right", no_wrap=True
        )
    for r in results["rows"]:
        reasons = sorted(r["reasons"].items(), key=lambda kv: -kv[1])[:3]
        table.add_row(
            r["scenario"],
            r["phase"],
            str(r["seed"]),
            str(r["ticks"]),
            str(r["ticks_over_budget"]),
            f"{r['cold_ticks_over_budget']}/{r['cold_ticks']}" if r["phase"] in ("steady", "before") else "-",
            "yes" if r["settled_over_budget"] else "no",
            _fmt(r["worst_true_rate"], 3),
            _fmt(r["settled_hedge_after_s"], 3),
            _fmt(r["best_hedge_after_s"], 3),
            _fmt(r["adaptive_p99_s"], 3),
            _fmt(r["best_p99_s"], 3),
            _fmt(r["regret"], 3),
            _fmt(r["changes_per_hour"], 1),
            _fmt(r["realized_hedge_rate"], 3),
            "-" if r["ticks_to_recover"] is None else str(r["ticks_to_recover"]),
            " ".join(r["clamps"]) or "-",
            " ".join(f"{k}:{v}" for k, v in reasons),
        )
    console.print(table)
    for name, target in results["summary"].items():
        value, limit = target["value"], target["limit"]
        met = value is not None and value <= limit
        console.print(
            f"{name}: {value if not isinstance(value, float) else round(value, 3)} (limit {limit}): "
            f"{'MET' if met else 'NOT MET'}"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Virtual-time evaluation of the hedgerow controller on the Azure conv trace."
    )
    root = Path(__file__).resolve().parents[1]
    default_trace = DEFAULT_TRACE if DEFAULT_TRACE.is_file() else (root / DEFAULT_TRACE).resolve()
    parser.add_argument("--trace", type=Path, default=default_trace, help="Azure trace CSV")
    parser.add_argument(
        "--suite",
        choices=("trace", "scenarios"),
        default="trace",
        help="trace: the Azure trace replay (default); scenarios: the generated-data scenarios",
    )
    parser.add_argument(
        "--scenario", action="append", default=None, help="with --suite scenarios: run only this one (repeatable)"
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="virtual seconds of the workload to replay (default: all of it)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="re-time the trace to this mean rate, requests/s (default: as recorded)",
    )
    parser.add_argument("--budget", type=float, default=0.10, help="hedge budget (fraction)")
    parser.add_argument("--burst", type=float, default=10.0, help="token-bucket burst (hedges)")
    parser.add_argument("--seed", type=int, default=0, help="first seed of the primary choice")
    parser.add_argument(
        "--seeds", type=int, default=3, help="runs per way, seeds SEED..SEED+N-1; figures are pooled over them"
    )
    parser.add_argument("--replicas", type=int, default=5, help="number of replicas")
    parser.add_argument("--max-batch", type=int, default=64, help="batch bound of each replica")
    parser.add_argument(
        "--shift-factor", type=float, default=3.0, help="service-time factor of the replica that slows down half way"
    )
    parser.add_argument(
        "--shift-at-s",
        type=float,
        default=None,
        help="virtual time of the shift (default: half of the workload's span)",
    )
    parser.add_argument("--fixed-s", type=float, default=2.0, help="hedge_after_s of the fixed way")
    parser.add_argument("--grid", type=int, default=16, help="fixed values tried for best_fixed")
    parser.add_argument(
        "--refine", type=int, default=4, help="extra values tried between the best grid value's neighbours"
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="leading seconds left out of the figures (default min(600, 20%% of span))",
    )
    parser.add_argument(
        "--interval-s",
        type=float,
        default=None,
        help="controller interval (default HEDGEROW_CONTROLLER_INTERVAL_S or 60)",
    )
    parser.add_argument(
        "--window-s", type=float, default=None, help="controller window (default HEDGEROW_WINDOW_S or 3600)"
    )
    parser.add_argument(
        "--minutes",
        action="store_true",
        help="feed the controller minute aggregates, as the live tick reads them (default: one entry per call)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench/results"),
        help="folder of the PNG (and of the JSON unless --json is given)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="JSON results file (default OUT_DIR/controller_eval.json)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 trace absent or bad option)."""
    args = _parser().parse_args(argv)
    if args.suite == "scenarios":
        return _main_scenarios(args)
    if not args.trace.is_file():
        print(
            f"controller_eval: trace not found: {args.trace} (the Azure conversation trace, "
            f"AzureLLMInferenceTrace_conv.csv; pass --trace FILE). Skipped.",
            file=sys.stderr,
        )
        return 2
    for name, low in (("replicas", 2), ("max_batch", 1), ("grid", 2), ("seeds", 1), ("refine", 0)):
        if getattr(args, name) < low:
            print(f"controller_eval: --{name.replace('_', '-')} is too small: {getattr(args, name)}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    try:
        results = run_evaluation(args, progress=lambda msg: print(msg, file=sys.stderr))
    except (TraceError, ValueError) as exc:
        print(f"controller_eval: {exc}", file=sys.stderr)
        return 2
    png = args.out_dir / "controller_eval.png"
    plot(results, png)
    wall_s = time.perf_counter() - start
    results.pop("_ways")
    results["wall_s"] = wall_s
    results["png"] = str(png)
    json_path = args.json or args.out_dir / "controller_eval.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results, wall_s)
    print(f"written {json_path} and {png}")
    return 0


def _main_scenarios(args: argparse.Namespace) -> int:
    """``--suite scenarios``: run, print, write ``OUT_DIR/controller_scenarios.json``."""
    if args.seeds < 1:
        print(f"controller_eval: --seeds is too small: {args.seeds}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    start = time.perf_counter()
    results = run_scenarios(args, progress=lambda msg: print(msg, file=sys.stderr))
    results["wall_s"] = time.perf_counter() - start
    json_path = args.json or args.out_dir / "controller_scenarios.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print_scenarios(results)
    print(f"wall time {results['wall_s']:.1f} s; written {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
