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
``raw_since(now)``, the calls one by one after it. With ``--bounded`` they reach them as the
bounded tick reads them (``HEDGEROW_CONTROLLER_OBSERVE=bounded``): each route's latest
``RECENT_CALLS`` (100) calls one by one, every other call in its minute's aggregates.

Run: ``python bench/controller_eval.py [--suite trace|scenarios] [--scenario NAME] [--json FILE]
[--out-dir bench/results] [--duration S] [--rate R] [--budget B] [--seed N] [--seeds K]
[--window-s S] [--interval-s S] [--minutes | --bounded]``. Prints a table and whether each target is met,
writes JSON (``--json``, default
``OUT_DIR/controller_eval.json``) and ``OUT_DIR/controller_eval.png`` (the adaptive threshold,
the 5-minute hedge rates and the 5-minute TTFT P99 over time, first seed). Not a test: nothing is
asserted; exits 2 with a message when the trace file is absent or an option is out of range.

Its steps, each in a file of its own (imported by file name): the controller in virtual time
(``controller_eval_virtual.py``), the workload and the measures (``controller_eval_measures.py``),
the tables and the figure (``controller_eval_tables.py``); this file runs the ways and the suites.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hedgerow.controller.policy.policy import RouteConfig
from hedgerow.settings import Settings
from hedgerow.sim.perf_model import load_perf_model
from hedgerow.sim.trace import TraceError
from hedgerow.sim.virtual import ClusterConfig, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts import each other by file name

from controller_eval_measures import (
    P99_TARGET_FACTOR,
    RATE_TARGET_FACTOR,
    WayResult,
    choose_best_fixed,
    grid_values,
    load_workload,
    summarize_way,
    trailing_rates,
)
from controller_eval_tables import plot, print_scenarios, print_table
from controller_eval_virtual import VirtualController

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
    grid_values_s = grid_values(none, args.grid, args.fixed_s)
    say(f"grid of {len(grid_values_s)} fixed values: {', '.join(f'{v:g}' for v in grid_values_s)}")
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

    try_values(grid_values_s)
    assert best is not None and best.hedge_after_s is not None
    # refine: geometric points between the best value's neighbours on the grid
    i = grid_values_s.index(best.hedge_after_s)
    low = grid_values_s[max(i - 1, 0)]
    high = grid_values_s[min(i + 1, len(grid_values_s) - 1)]
    refined = sorted({round(float(v), 4) for v in np.geomspace(low, high, args.refine + 2)[1:-1]} - set(grid_values_s))
    if refined:
        say(f"refined around {best.hedge_after_s:g} s: {', '.join(f'{v:g}' for v in refined)}")
        try_values(refined)
    candidates.sort(key=lambda c: c.hedge_after_s or 0.0)
    best = choose_best_fixed(candidates, args.budget)
    best_fixed = WayResult("best_fixed", best.hedge_after_s, best.summary, best.runs)
    say("adaptive")
    runs, histories = [], []
    for seed in seeds:
        controller = VirtualController(route, settings, minutes=args.minutes, bounded=args.bounded)
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
            "bounded": args.bounded,
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
            controller = VirtualController(route, settings, minutes=args.minutes, bounded=args.bounded)
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
        "bounded": args.bounded,
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
        "--bounded",
        action="store_true",
        help="feed the controller as the bounded tick reads the store (latest 100 calls one by one, minutes before)",
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
