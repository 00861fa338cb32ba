"""Smoke test of ``bench/controller_eval.py``: a short run writes the JSON and the PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "controller_eval.py"
TRACE = ROOT / ".." / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
WAY_KEYS = {
    "way",
    "ttft_p50_s",
    "ttft_p99_s",
    "ttft_p999_s",
    "hedge_rate",
    "worst_window_hedge_rate",
    "wasted_completion_tokens",
}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, check=False, text=True, timeout=280
    )


@pytest.mark.slow
def test_short_run_writes_json_and_png(tmp_path: Path) -> None:
    if not TRACE.is_file():
        pytest.skip(f"Azure conversation trace absent: {TRACE}")
    out = tmp_path / "out"
    json_path = tmp_path / "eval.json"
    done = _run(
        "--trace",
        str(TRACE),
        "--duration",
        "900",
        "--grid",
        "3",
        "--interval-s",
        "30",
        "--out-dir",
        str(out),
        "--json",
        str(json_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(json_path.read_text())
    assert results["budget"] == 0.10
    assert [w["way"] for w in results["ways"]] == ["none", "fixed", "best_fixed", "adaptive"]
    for way in results["ways"]:
        assert set(way) >= WAY_KEYS, way
        assert 0 < way["ttft_p50_s"] <= way["ttft_p99_s"] <= way["ttft_p999_s"]
        assert 0 <= way["hedge_rate"] <= 1
    none, fixed = results["ways"][0], results["ways"][1]
    assert none["hedge_rate"] == 0 and none["wasted_completion_tokens"] == 0
    assert fixed["hedge_after_s"] == 2.0
    assert results["adaptive_history"], "the controller never ticked"
    # the bench feeds the policy the production inputs (observe_window): the objective ran on the
    # window's primary samples with their arrival order (bucket replay)
    objective = [
        h["details"]["objective"] for h in results["adaptive_history"] if h["details"] and "objective" in h["details"]
    ]
    assert objective and all(o["bucket_replay"] for o in objective)
    assert all(o["chosen_s"] >= o["budget_target_s"] for o in objective)
    assert all(h["details"]["binding"] for h in results["adaptive_history"])
    assert set(results["targets"]) == {"window_rate", "p99_vs_best_fixed"}
    png = out / "controller_eval.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "adaptive" in done.stdout and "target 1" in done.stdout


@pytest.mark.slow
def test_scenario_suite_scores_each_phase(tmp_path: Path) -> None:
    json_path = tmp_path / "scenarios.json"
    done = _run(
        "--suite", "scenarios", "--seeds", "1", "--scenario", "ties", "--scenario", "few_calls",
        "--json", str(json_path), "--out-dir", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads(json_path.read_text())
    assert [(r["scenario"], r["phase"]) for r in results["rows"]] == [("few_calls", "steady"), ("ties", "steady")]
    for row in results["rows"]:
        assert row["ticks"] > 0 and row["regret"] >= 0.9 and row["best_p99_s"] > 0
        assert 0 <= row["ticks_over_budget"] <= row["ticks"]
    assert set(results["summary"]) >= {"regret_median", "ticks_over_budget_cold_start", "unlabelled_clamps"}
    assert "regret_median" in done.stdout


def test_missing_trace_is_a_clear_message(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    done = _run("--trace", str(missing), "--out-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert "trace not found" in done.stderr and str(missing) in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "controller_eval.json").exists()


def test_bad_option_is_a_clear_message(tmp_path: Path) -> None:
    if not TRACE.is_file():
        pytest.skip(f"Azure conversation trace absent: {TRACE}")
    done = _run("--trace", str(TRACE), "--duration", "-5", "--out-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert "--duration" in done.stderr and "Traceback" not in done.stderr
