"""The tables and the figure of ``bench/controller_eval.py``: what a run prints and plots.

``print_table`` (the trace suite's ways and targets), ``print_scenarios`` (the scenario suite's
rows and targets) and ``plot`` (the PNG: the adaptive threshold, the 5-minute hedge rates and
the 5-minute TTFT P99 over time, first seed).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
from controller_eval_measures import MIN_WINDOW_CALLS, RATE_TARGET_FACTOR, RATE_WINDOW_S, WayResult, trailing_rates

__all__ = ["plot", "print_scenarios", "print_table"]


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
