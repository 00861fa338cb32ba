"""Write the current figures of the controller's evaluation into ``docs/evaluation.md``.

The page's section between the markers ``<!-- BEGIN generated`` and ``<!-- END generated -->``
is replaced by tables made from the JSON of two runs of ``bench/controller_eval.py``: the
scenario suite (``--suite scenarios``: per scenario and phase, ticks over budget, the worst true
hedge rate, the P99 regret against the hindsight-best threshold within budget, changes per hour;
then the suite's targets) and the Azure trace replay (per way: TTFT P50/P99/P99.9, hedge rate and
the worst 5-minute hedge rate; then its two targets). The rest of the page is left as it is.

Run: ``python bench/evaluation_doc.py [--run] [--minutes] [--scenarios FILE] [--trace-json FILE]
[--doc FILE] [--trace CSV]``. With ``--run`` both suites run first (``bench/controller_eval.py``
with its defaults, writing the two JSON files; about 10 minutes on 2 cores); without it the
JSON files of earlier runs are read (``bench/results/controller_scenarios.json`` and
``bench/results/controller_eval.json``, the benchmark's own defaults). Exits 2 with a message
naming the file when a JSON file is absent or unreadable, or the page has no markers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "evaluation.md"
RESULTS = ROOT / "bench" / "results"
BEGIN = "<!-- BEGIN generated"
END = "<!-- END generated -->"

__all__ = ["main", "render", "replace_section"]


class DocError(Exception):
    """A JSON file or the page cannot be used; the message names it."""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _scenario_lines(results: dict[str, Any]) -> list[str]:
    rows = results["rows"]
    if not rows:
        raise DocError("the scenario results hold no rows; rerun the suite")
    seeds = sorted({r["seed"] for r in rows})
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["phase"]), []).append(r)
    body = []
    for (scenario, phase), runs in groups.items():
        regrets = [r["regret"] for r in runs]
        body.append(
            [
                scenario,
                phase,
                str(sum(r["ticks_over_budget"] for r in runs)),
                _fmt(max(r["worst_true_rate"] for r in runs)),
                _fmt(float(np.median(regrets))),
                _fmt(max(regrets)),
                _fmt(max(r["changes_per_hour"] for r in runs), 1),
            ]
        )
    lines = [
        f"Scenario suite (`bench/controller_eval.py --suite scenarios{' --minutes' if results.get('minutes') else ''}`,"
        f" seeds {seeds[0]}-{seeds[-1]}; ticks over budget summed over the seeds, the rest over"
        " the seeds as named):",
        "",
    ]
    lines += _table(
        [
            "scenario",
            "phase",
            "ticks over budget",
            "worst true rate",
            "regret median",
            "regret max",
            "changes/h max",
        ],
        body,
        right_from=2,
    )
    lines += ["", "Its targets:", ""]
    target_rows = [
        [
            name,
            _fmt(t["value"]),
            _fmt(t["limit"]),
            "MET" if t["value"] is not None and t["value"] <= t["limit"] else "NOT MET",
        ]
        for name, t in results["summary"].items()
    ]
    lines += _table(["target", "value", "limit", ""], target_rows)
    return lines


def _trace_lines(results: dict[str, Any]) -> list[str]:
    config = results["config"]
    seeds = config["seeds"]
    lines = [
        f"Azure trace replay (`bench/controller_eval.py{' --minutes' if config.get('minutes') else ''}`;"
        f" {config['requests']:,} requests over {config['span_s']:.0f} s, one of {config['replicas']} replicas"
        f" {config['shift_factor']:g}x slower from {config['shift_at_s']:.0f} s;"
        f" seeds {seeds[0]}-{seeds[-1]} pooled, after a {config['warmup_s']:.0f} s warm-up;"
        f" budget {results['budget']:g}):",
        "",
    ]
    body = [
        [
            w["way"],
            "adaptive" if w["way"] == "adaptive" else _fmt(w["hedge_after_s"]),
            _fmt(w["ttft_p50_s"]),
            _fmt(w["ttft_p99_s"]),
            _fmt(w["ttft_p999_s"]),
            _fmt(w["hedge_rate"], 4),
            _fmt(w["worst_window_hedge_rate"], 4),
        ]
        for w in results["ways"]
    ]
    lines += _table(["way", "hedge_after_s", "TTFT P50 s", "P99 s", "P99.9 s", "hedge rate", "worst 5-min rate"], body)
    window, p99 = results["targets"]["window_rate"], results["targets"]["p99_vs_best_fixed"]
    lines += [
        "",
        f"Targets: every 5-minute hedge rate after the warm-up <= {window['limit']:.3f}:"
        f" {'MET' if window['met'] else 'NOT MET'} (worst {_fmt(window['worst_window_hedge_rate'], 4)});"
        f" adaptive P99 <= {p99['limit_p99_s']:.3f} s (1.1x best fixed) at no more hedging than best fixed"
        f" ({p99['best_fixed_hedge_rate']:.4f}): {'MET' if p99['met'] else 'NOT MET'}"
        f" (adaptive {p99['adaptive_p99_s']:.3f} s, {p99['adaptive_hedge_rate']:.4f}).",
    ]
    return lines


def render(scenarios: dict[str, Any], trace: dict[str, Any], stamp: str) -> str:
    """The generated section's text (without the markers).

    Args:
        scenarios: the JSON of ``controller_eval.py --suite scenarios``.
        trace: the JSON of ``controller_eval.py`` (the trace suite).
        stamp: who and when, e.g. ``"commit 1a2b3c4, 2026-01-05 10:00 UTC"``.

    Returns:
        Markdown, ending with a newline.

    Raises:
        KeyError: a JSON file lacks a field the tables need.
    """
    lines = [f"Written by `bench/evaluation_doc.py` ({stamp}) from the two runs' JSON.", ""]
    lines += [*_scenario_lines(scenarios), "", *_trace_lines(trace)]
    return "\n".join(lines) + "\n"


def replace_section(page: str, section: str) -> str:
    """``page`` with the text between its markers replaced by ``section``.

    Raises:
        DocError: the page lacks a marker, or has them out of order.
    """
    begin, end = page.find(BEGIN), page.find(END)
    if begin < 0 or end < 0 or end < begin:
        raise DocError(f"the page has no '{BEGIN} ...' line followed by '{END}'")
    begin_end = page.index("\n", begin) + 1
    return page[:begin_end] + section + page[end:]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DocError(f"{path} not found: run bench/controller_eval.py first, or pass --run") from None
    except (OSError, ValueError) as exc:
        raise DocError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DocError(f"{path} is not a JSON object")
    return data


def _stamp() -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return when
    return f"commit {commit}, {when}"


def _run_suites(args: argparse.Namespace) -> int:
    base = [sys.executable, str(ROOT / "bench" / "controller_eval.py"), *(["--minutes"] if args.minutes else [])]
    trace = ["--trace", str(args.trace)] if args.trace else []
    for extra in (["--suite", "scenarios", "--json", str(args.scenarios)], [*trace, "--json", str(args.trace_json)]):
        done = subprocess.run([*base, *extra], cwd=ROOT, check=False)
        if done.returncode != 0:
            return done.returncode
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 written, 2 a file is missing or bad)."""
    parser = argparse.ArgumentParser(description="Write the controller's current figures into docs/evaluation.md.")
    parser.add_argument("--run", action="store_true", help="run both suites of bench/controller_eval.py first")
    parser.add_argument("--minutes", action="store_true", help="with --run: feed the controller minute aggregates")
    parser.add_argument("--trace", type=Path, default=None, help="with --run: the Azure trace CSV")
    parser.add_argument("--scenarios", type=Path, default=RESULTS / "controller_scenarios.json")
    parser.add_argument("--trace-json", type=Path, default=RESULTS / "controller_eval.json")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to write (default docs/evaluation.md)")
    args = parser.parse_args(argv)
    if args.run and (status := _run_suites(args)) != 0:
        print(f"evaluation_doc: bench/controller_eval.py exited {status}; the page is left as it was", file=sys.stderr)
        return 2
    try:
        page = args.doc.read_text()
        replace_section(page, "")  # the markers first: refuse a page without them before any work
        page = replace_section(page, render(_load(args.scenarios), _load(args.trace_json), _stamp()))
    except DocError as exc:
        print(f"evaluation_doc: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"evaluation_doc: a results file lacks the field {exc}; rerun its benchmark", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"evaluation_doc: {args.doc}: {exc}", file=sys.stderr)
        return 2
    args.doc.write_text(page)
    print(f"written {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
