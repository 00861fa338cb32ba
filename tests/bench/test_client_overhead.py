"""Smoke test of ``bench/client_overhead.py``: it runs end to end and writes sound JSON.

Speed is not asserted (that is the benchmark's output, not a test's business).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "client_overhead.py"


def test_client_overhead_smoke(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--calls", "20", "--warmup", "2", "--tokens", "8", "--sdk", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "hedging - naive " in done.stdout and "hedging - plain " in done.stdout
    assert "sdk_transport - sdk" in done.stdout and "sync_sdk_transport - sync_sdk" in done.stdout
    document = json.loads(out.read_text())
    assert document["calls"] == 20 and document["tokens"] == 8
    # Per call: role chunk, 8 content chunks, finish chunk, usage chunk.
    for mode in ("naive", "plain", "plain_close", "hedging", "sdk", "sdk_transport", "sync_sdk", "sync_sdk_transport"):
        result = document["results"][mode]
        assert result["chunks"] == 20 * 11
        assert 0 < result["ttft_ms_median"] <= result["ttft_ms_p99"]
        assert result["cpu_us_per_chunk"] > 0
        assert 0 < result["cpu_us_to_first_token_median"] < result["cpu_us_per_chunk"] * 11
    assert all("added_cpu_us_to_first_token" in pair for pair in document["added"].values())
    assert set(document["added"]) == {
        "hedging - naive",
        "hedging - plain",
        "hedging - plain_close",
        "sdk_transport - sdk",
        "sync_sdk_transport - sync_sdk",
    }


def test_client_overhead_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--calls", "0"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "--calls" in done.stderr
