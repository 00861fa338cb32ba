"""Smoke test of ``bench/gateway.py``: a quick run (without LiteLLM) end to end writes sound JSON.

Speed is not asserted (that is the benchmark's output, not a test's business): only that every
(way, streams) row is there, its calls succeeded, and its figures are positive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"


def test_gateway_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seconds", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gateway vs" in done.stdout and "litellm" not in done.stdout
    document = json.loads(out.read_text())
    assert document["ways"] == ["direct", "relay", "passthrough", "gateway"] and document["litellm_skipped"] is None
    rows = {(row["way"], row["streams"]): row for row in document["rows"]}
    assert set(rows) == {
        (way, streams) for way in ("direct", "relay", "passthrough", "gateway") for streams in (1, 16, 64)
    }
    for (way, _), row in rows.items():
        # A hedge may fire: at 64 streams on a loaded machine the gateway's own queueing can pass 2 s.
        # A broken proxy fails every call; a loaded machine (the suite's other workers) a few.
        assert row["requests"] > 0 and 0 <= row["hedged"] <= row["requests"]
        assert row["errors"] <= max(1, row["requests"] // 20), (way, row["errors"], row["error_kinds"])
        assert row["rate_per_s"] > 0 and 0 < row["ttft_ms_p50"] <= row["ttft_ms_p99"]
        assert row["client_cpu_ms_per_request"] > 0
        if way == "relay":  # a few clock ticks of CPU in a 1 s cell: may round to none
            assert row["proxy_cpu_ms_per_request"] >= 0
        elif way in ("passthrough", "gateway"):
            assert row["proxy_cpu_ms_per_request"] > 0 and row["proxy_requests_per_cpu_s"] > 0
        else:
            assert row["proxy_cpu_ms_per_request"] is None
    assert [entry["streams"] for entry in document["gateway_vs"]] == [1, 16, 64]
    assert all(
        "relay_added_ttft_ms_p50" in entry and "passthrough_added_ttft_ms_p50" in entry
        for entry in document["gateway_vs"]
    )


def test_gateway_bench_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--streams", "0,16"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "--streams" in done.stderr
