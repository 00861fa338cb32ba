"""Benchmark: ``hedgerow demo`` run N times, one row per run (issue 15's "4 of 5 runs" check).

Each run is a separate ``hedgerow demo --quick --json FILE`` process (with ``--trace`` when
given), exactly as a user runs it, one after the other so that runs do not load each other. From
each run's JSON the table takes, for the half **after the change of conditions**:

- ``fixed at``: the fixed way's ``hedge_after_s`` (the none way's P90 before the change unless
  ``--fixed-hedge-after`` was given);
- ``none`` / ``fixed`` / ``adaptive``: each way's TTFT P99 after the change, seconds;
- ``interval``: the demo's 95% bootstrap interval of adaptive's minus fixed's P99 after the
  change, seconds;
- ``adaptive hedged``: adaptive's hedge rate over its whole measured run and after the change;
- ``fixed hedged``: the fixed way's hedge rate over its whole measured run;
- ``win``: adaptive's P99 after the change is below fixed's **and** adaptive's whole-run hedge
  rate is within the budget (the demo's own budget, 10% by default); ``clear`` when the interval
  also lies below zero.

The closing line counts the runs that win, and the load average (``os.getloadavg``) before each
run is printed with it, since the demo's replicas are real processes that share the machine.

Run: ``python bench/demo_repeat.py [--runs 5] [--trace FILE] [--json bench/results/demo_repeat.json]
[-- extra demo flags]``. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_once", "summarize_run"]


def run_once(trace: str | None, extra: list[str], workdir: Path, index: int) -> dict[str, Any]:
    """Run ``hedgerow demo --quick`` once in ``workdir`` and return its parsed ``--json`` output.

    Args:
        trace: a trace CSV for ``--trace``, or None for the built-in workload.
        extra: further demo flags, passed as they are.
        workdir: a folder for the run's JSON and report (the demo writes its report there).
        index: the run's number, used in file names.

    Returns:
        The demo's JSON result, with ``wall_s`` and ``load_before`` (1-minute load average) added.

    Raises:
        RuntimeError: the demo exited non-zero (its stderr tail is in the message).
    """
    json_path = workdir / f"run{index}.json"
    cmd = [sys.executable, "-m", "hedgerow.cli", "demo", "--quick", "--json", str(json_path)]
    cmd += ["--report-dir", str(workdir / f"report{index}")]
    if trace:
        cmd += ["--trace", trace]
    cmd += extra
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"demo run {index} exited {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(json_path.read_text())
    result["wall_s"] = time.monotonic() - started
    result["load_before"] = load_before
    return result


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    """The row of one run: the after-change P99 of each way, hedge rates and the verdict.

    Args:
        result: one demo ``--json`` result (as :func:`run_once` returns it).

    Returns:
        A flat dict: ``fixed_at_s``, ``{none,fixed,adaptive}_after_p99_s``, ``interval_s`` (a pair
        or None), ``adaptive_hedge_rate``, ``adaptive_after_hedge_rate``, ``fixed_hedge_rate``,
        ``budget``, ``win`` and ``clear`` (see the module docstring), ``load_before``, ``wall_s``.
    """
    modes = {m["mode"]: m for m in result["modes"]}
    budget = float(result["config"]["budget"])

    def after_p99(mode: str) -> float | None:
        part = modes[mode].get("after_change") or {}
        value = part.get("ttft_p99_s")
        return None if value is None else float(value)

    adaptive, fixed = after_p99("adaptive"), after_p99("fixed")
    interval = result.get("after_change_p99_difference_s")
    adaptive_rate = float(modes["adaptive"]["hedge_rate"])
    win = adaptive is not None and fixed is not None and adaptive < fixed and adaptive_rate <= budget
    clear = bool(win and interval is not None and interval[1] < 0)
    return {
        "fixed_at_s": result.get("fixed_hedge_after_s"),
        "none_after_p99_s": after_p99("none"),
        "fixed_after_p99_s": fixed,
        "adaptive_after_p99_s": adaptive,
        "interval_s": interval,
        "adaptive_hedge_rate": adaptive_rate,
        "adaptive_after_hedge_rate": (modes["adaptive"].get("after_change") or {}).get("hedge_rate"),
        "fixed_hedge_rate": float(modes["fixed"]["hedge_rate"]),
        "budget": budget,
        "win": win,
        "clear": clear,
        "load_before": result.get("load_before"),
        "wall_s": result.get("wall_s"),
    }


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| run | load | fixed at | none | fixed | adaptive | interval (adaptive − fixed) "
        "| adaptive hedged, whole / after | fixed hedged | win |"
    )
    lines = [head, "|" + "---|" * 10]
    for i, row in enumerate(rows, 1):
        interval = row["interval_s"]
        span = "-" if interval is None else f"{interval[0]:+.2f} … {interval[1]:+.2f}"
        after = row["adaptive_after_hedge_rate"]
        verdict = "clear" if row["clear"] else ("yes" if row["win"] else "no")
        lines.append(
            f"| {i} | {_fmt(row['load_before'], '.1f')} | {_fmt(row['fixed_at_s'])} | {_fmt(row['none_after_p99_s'])} "
            f"| {_fmt(row['fixed_after_p99_s'])} | {_fmt(row['adaptive_after_p99_s'])} | {span} "
            f"| {row['adaptive_hedge_rate']:.1%} / {_fmt(after, '.1%')} | {row['fixed_hedge_rate']:.1%} | {verdict} |"
        )
    wins = sum(r["win"] for r in rows)
    lines.append("")
    lines.append(f"adaptive below fixed after the change, within the budget: {wins} of {len(rows)} runs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the demo ``--runs`` times, print the table and write the JSON; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trace", default=None, help="trace CSV passed to the demo's --trace")
    parser.add_argument("--json", dest="json_path", default=None, help="write rows and raw results here")
    parser.add_argument("extra", nargs="*", help="further demo flags, after --")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: must be at least 1")
    rows: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hedgerow-demo-repeat-") as tmp:
        for i in range(1, args.runs + 1):
            result = run_once(args.trace, args.extra, Path(tmp), i)
            raw.append(result)
            rows.append(summarize_run(result))
            print(f"run {i}/{args.runs} done in {rows[-1]['wall_s']:.0f} s", file=sys.stderr)
    print(_table(rows))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps({"trace": args.trace, "rows": rows, "runs": raw}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
