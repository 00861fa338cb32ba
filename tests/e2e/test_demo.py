"""``hedgerow demo`` runs end to end and writes its results.

The demo is the main job: it starts ``serve``, three replicas and the load generator as real
processes on loopback. This test checks that it completes and that what it reports is
consistent (three ways, calls measured before and after the change, hedging only where asked,
the fixed way at the none way's P90, the budget held, the api's published value, the report),
not how much faster the adaptive way is: that is a measurement, reported by the demo itself.
It runs a shorter load than ``--quick`` (10 s per way at 14 req/s, about a minute in all); the
arithmetic, the table and the sentences are checked on hand-built records in
``tests/sim/test_demo_summary.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hedgerow.client import Upstream
from hedgerow.sim import ReplicaConfig, ReplicaThread, perf_model
from hedgerow.sim._demo_io import perf_model_notice

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"

#: The JSON keys of every way before the change of conditions was added; they must stay.
OLD_MODE_KEYS = {
    "mode", "calls", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_max_s", "hedge_rate", "backup_win_rate",
    "wasted_completion_tokens", "errors", "final_hedge_after_s", "threshold_path_s", "records_rejected",
    "extra_prompt_tokens", "overhead_share",
}  # fmt: skip


@pytest.mark.slow
def test_demo_runs_three_ways_through_a_change_and_reports(tmp_path: Path) -> None:
    out_json = tmp_path / "demo.json"
    args = [sys.executable, "-m", "hedgerow.cli", "demo", "--quick", "--duration", "10", "--rate", "14"]
    args += ["--json", str(out_json)]
    if TRACE.is_file():
        args += ["--trace", str(TRACE)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    payload = json.loads(out_json.read_text())
    assert {"modes", "config", "report_files", "change", "fixed_hedge_after_s", "sentences"} <= set(payload)

    # The banner: one phrase per line, none wrapped by an 80-column terminal (but the trace's path).
    banner = done.stdout.splitlines()[:7]
    assert banner[0].startswith("hedgerow demo:") and banner[1].startswith("  workload: ")
    assert all(len(line) <= 80 for line in banner[:1] + banner[2:]), banner
    assert "halfway through each way: replica-b slowed down 2.5x as well" in done.stdout
    assert "P99.9" in done.stdout and "adaptive" in done.stdout
    flat = " ".join(done.stdout.split())
    assert len(payload["sentences"]) == 3 and all(" ".join(s.split()) in flat for s in payload["sentences"])

    modes = {m["mode"]: m for m in payload["modes"]}
    assert list(modes) == ["none", "fixed", "adaptive"]
    change = payload["change"]
    assert change["kind"] == "degrade" and change["replica"] == "replica-b" and change["slowdown_after"] == 2.5
    for mode in modes.values():
        assert set(mode) >= OLD_MODE_KEYS
        assert mode["calls"] > 90
        assert mode["records_rejected"] == 0  # every record the clients built is consistent
        before, after = mode["before_change"], mode["after_change"]
        assert before["calls"] > 20 and after["calls"] > 40 and before["calls"] + after["calls"] == mode["calls"]
        for part in (mode, before, after):
            q = [part[k] for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_p999_s", "ttft_max_s")]
            assert all(v is not None and v > 0 for v in q) and q == sorted(q), (mode["mode"], q)
    assert modes["none"]["hedge_rate"] == 0.0 and modes["none"]["backup_win_rate"] is None
    # The manual recipe: the fixed way hedges at the none way's P90 before the change.
    assert payload["fixed_source"] == "p90_of_none" and modes["fixed"]["hedge_after_source"] == "p90_of_none"
    assert payload["fixed_hedge_after_s"] == pytest.approx(modes["none"]["before_change"]["ttft_p90_s"], abs=5e-4)
    assert modes["fixed"]["hedge_after_s"] == payload["fixed_hedge_after_s"]
    # The token bucket bounds each hedging way's hedges to budget x calls + burst, counting the
    # warm-up calls it also served (left out of the figures, not out of the bucket).
    config = payload["config"]
    for name in ("fixed", "adaptive"):
        way = modes[name]
        sent = way["calls"] / (1 - config["warmup_fraction"]) + 1
        assert way["hedge_rate"] * way["calls"] <= config["budget"] * sent + config["budget_burst"] + 1e-6, name
    # The adaptive way polled a threshold set by the controller; the table shows the api's value.
    adaptive = modes["adaptive"]
    assert adaptive["final_hedge_after_s"] is not None and adaptive["published_hedge_after_s"] is not None
    if adaptive["threshold_path_s"]:
        assert round(adaptive["published_hedge_after_s"], 3) in adaptive["threshold_path_s"]
    # What hedging cost: losers' tokens, their share of all tokens, the overhead at the demo price.
    assert modes["none"]["extra_prompt_tokens"] == 0 and modes["none"]["overhead_share"] == 0.0
    assert modes["none"]["extra_token_share"] == 0.0
    # A loser's prompt counts only where its upstream accepted it (2xx headers came): on a loaded
    # machine a loser may still be waiting for its connection or headers when it is cancelled, and
    # a backup that lost may or may not have had its headers, so the figures are checked for
    # consistency here; the rule itself is tested in tests/client/test_record_costs.py.
    for name in ("fixed", "adaptive"):
        way = modes[name]
        assert way["extra_prompt_tokens"] >= 0 and 0 <= (way["overhead_share"] or 0) < 1, name
        assert 0 <= (way["extra_token_share"] or 0) < 1, name
        if way["extra_prompt_tokens"]:
            assert way["overhead_share"] > 0 and way["hedge_rate"] > 0, name
    assert modes["fixed"]["hedge_rate"] > 0 or modes["adaptive"]["hedge_rate"] > 0
    # The demo wrote the weekly report of its run (HTML and JSON) and said where.
    files = [Path(p) if Path(p).is_absolute() else tmp_path / p for p in payload["report_files"]]
    assert [f.suffix for f in files] == [".html", ".json"] and all(f.is_file() for f in files)
    assert "weekly report of the run" in done.stdout
    # The store says what each way's clients did: none disabled, fixed pinned at its threshold.
    routes = {r["route"]: r for r in json.loads(files[1].read_text())["routes"]}
    assert routes["demo-none"]["enabled"] is False
    assert routes["demo-fixed"]["pinned_hedge_after_s"] == pytest.approx(payload["fixed_hedge_after_s"])
    assert routes["demo-adaptive"]["enabled"] is True and routes["demo-adaptive"]["pinned_hedge_after_s"] is None
    report = json.loads(files[1].read_text())
    assert report["partial"] is True
    assert {s["route"] for s in report["routes"]} == {"demo-none", "demo-fixed", "demo-adaptive"}
    assert report["total"]["cost"]["price_status"] == "priced" and report["total"]["cost"]["spend_usd"] > 0
    assert files[0].read_text().count("<svg") == 1 + 3 * 3


async def test_the_notice_names_replicas_on_the_embedded_speed_table(monkeypatch: pytest.MonkeyPatch) -> None:
    with_file = ReplicaThread(ReplicaConfig(name="replica-a"), port=0).start()
    monkeypatch.setattr(perf_model, "default_perf_model_path", lambda repo_root=None: None)
    embedded = ReplicaThread(ReplicaConfig(name="replica-b"), port=0).start()
    try:
        upstreams = [Upstream(r.config.name, r.base_url) for r in (with_file, embedded)]
        async with httpx.AsyncClient() as http:
            notice = await perf_model_notice(http, upstreams)
            alone = await perf_model_notice(http, upstreams[:1])
    finally:
        with_file.stop()
        embedded.stop()
    assert notice is not None and "replica-b" in notice and "embedded Splitwise speed table" in notice
    assert "splitwise_perf_model.csv was not found" in notice
    if (TRACE.parent / "splitwise_perf_model.csv").is_file():  # replica-a found the shared CSV
        assert notice.startswith("notice: replica-b uses the embedded") and alone is None
