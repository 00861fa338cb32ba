"""``bench/demo_repeat.py``: the row and verdict it derives from a demo's ``--json`` result.

The demo itself runs end to end in ``tests/e2e/test_demo.py``; here its JSON shape is built by
hand so the verdict rule (adaptive's P99 after the change below fixed's, with its whole-run hedge
rate within the budget; ``clear`` when the bootstrap interval lies below zero) is checked on each
side of every edge.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "demo_repeat.py"


@pytest.fixture(scope="module")
def demo_repeat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_repeat", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(
    fixed_p99: float, adaptive_p99: float, adaptive_rate: float, interval: list[float] | None
) -> dict[str, Any]:
    def mode(name: str, p99: float | None, rate: float) -> dict[str, Any]:
        return {"mode": name, "hedge_rate": rate, "after_change": {"ttft_p99_s": p99, "hedge_rate": rate + 0.01}}

    return {
        "config": {"budget": 0.10},
        "fixed_hedge_after_s": 0.097,
        "after_change_p99_difference_s": interval,
        "modes": [
            mode("none", 1.8, 0.0),
            mode("fixed", fixed_p99, 0.13),
            mode("adaptive", adaptive_p99, adaptive_rate),
        ],
        "load_before": 0.5,
        "wall_s": 120.0,
    }


@pytest.mark.parametrize(
    ("fixed", "adaptive", "rate", "interval", "win", "clear"),
    [
        (1.2, 0.8, 0.086, [-0.67, -0.02], True, True),
        (1.2, 0.8, 0.086, [-0.32, +0.23], True, False),
        (1.2, 0.8, 0.101, [-0.67, -0.02], False, False),  # over the budget: no win however clear
        (1.2, 0.8, 0.100, None, True, False),  # at the budget is within it
        (0.8, 0.8, 0.05, [-0.1, 0.1], False, False),  # a tie is not lower
        (0.8, 0.9, 0.05, [0.01, 0.2], False, False),
    ],
)
def test_verdict_rule(
    demo_repeat: ModuleType,
    fixed: float,
    adaptive: float,
    rate: float,
    interval: list[float] | None,
    win: bool,
    clear: bool,
) -> None:
    row = demo_repeat.summarize_run(_result(fixed, adaptive, rate, interval))
    assert (row["win"], row["clear"]) == (win, clear)
    assert row["fixed_after_p99_s"] == fixed and row["adaptive_after_p99_s"] == adaptive
    assert row["adaptive_after_hedge_rate"] == pytest.approx(rate + 0.01)


def test_table_counts_the_wins(demo_repeat: ModuleType) -> None:
    rows = [
        demo_repeat.summarize_run(_result(1.2, 0.8, 0.086, [-0.5, -0.1])),
        demo_repeat.summarize_run(_result(1.2, 1.3, 0.086, [0.0, 0.2])),
    ]
    table = demo_repeat._table(rows)
    assert table.splitlines()[-1] == "adaptive below fixed after the change, within the budget: 1 of 2 runs"
    assert "| 1 | 0.5 | 0.097 | 1.800 | 1.200 | 0.800 | -0.50 … -0.10 | 8.6% / 9.6% | 13.0% | clear |" in table
