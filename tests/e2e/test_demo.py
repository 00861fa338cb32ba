"""``hedgerow demo --quick`` runs end to end and writes its results.

The demo is the main job: it starts ``serve``, three replicas and the load generator as real
processes on loopback. This test checks that it completes and that what it reports is
consistent (three ways, calls measured, hedging only where asked, the budget held), not how much
faster the adaptive way is: that is a measurement, reported by the demo itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.mark.slow
def test_demo_quick_runs_and_reports_three_ways(tmp_path: Path):
    out_json = tmp_path / "demo.json"
    args = [sys.executable, "-m", "hedgerow.cli", "demo", "--quick", "--json", str(out_json)]
    if TRACE.is_file():
        args += ["--trace", str(TRACE)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "adaptive" in done.stdout and "P99" in done.stdout

    modes = {m["mode"]: m for m in json.loads(out_json.read_text())["modes"]}
    assert list(modes) == ["none", "fixed", "adaptive"]
    for mode in modes.values():
        assert mode["calls"] > 100
        assert mode["records_rejected"] == 0  # every record the clients built is consistent
        for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_max_s"):
            assert mode[key] is not None and mode[key] > 0
        assert mode["ttft_p50_s"] <= mode["ttft_p90_s"] <= mode["ttft_p99_s"] <= mode["ttft_max_s"]
    assert modes["none"]["hedge_rate"] == 0.0 and modes["none"]["backup_win_rate"] is None
    # The token bucket bounds hedges to budget x calls + burst (10): well under 20% here.
    assert modes["adaptive"]["hedge_rate"] <= 0.2
    # The adaptive way polled a threshold set by the controller.
    assert modes["adaptive"]["final_hedge_after_s"] is not None
    # What hedging cost: losers' prompt tokens and the overhead share at the demo price.
    assert modes["none"]["extra_prompt_tokens"] == 0 and modes["none"]["overhead_share"] == 0.0
    # A loser's prompt counts only where its upstream accepted it (2xx headers came): on a loaded
    # machine a loser may still be waiting for its connection or headers when it is cancelled, so
    # the figures are checked for consistency here; the rule itself is tested in
    # tests/client/test_record_costs.py.
    for way in ("fixed", "adaptive"):
        assert modes[way]["extra_prompt_tokens"] >= 0 and 0 <= (modes[way]["overhead_share"] or 0) < 1, way
        if modes[way]["extra_prompt_tokens"]:
            assert modes[way]["overhead_share"] > 0 and modes[way]["hedge_rate"] > 0, way
        else:
            assert modes[way]["extra_prompt_tokens"] == 0 and modes[way]["overhead_share"] == 0.0, way
    assert modes["fixed"]["hedge_rate"] > 0 or modes["adaptive"]["hedge_rate"] > 0
    # The demo wrote the weekly report of its run (HTML and JSON) and said where.
    files = [
        Path(p) if Path(p).is_absolute() else tmp_path / p for p in json.loads(out_json.read_text())["report_files"]
    ]
    assert [f.suffix for f in files] == [".html", ".json"] and all(f.is_file() for f in files)
    assert "weekly report of the run" in done.stdout
    report = json.loads(files[1].read_text())
    assert report["partial"] is True
    assert {s["route"] for s in report["routes"]} == {"demo-none", "demo-fixed", "demo-adaptive"}
    assert report["total"]["cost"]["price_status"] == "priced" and report["total"]["cost"]["spend_usd"] > 0
    assert files[0].read_text().count("<svg") == 1 + 3 * 3
