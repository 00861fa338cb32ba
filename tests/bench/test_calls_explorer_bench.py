"""Smoke test of ``bench/calls_explorer.py``: it runs end to end and writes sound JSON (speed not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "calls_explorer.py"


def test_calls_explorer_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    env = {k: v for k, v in os.environ.items() if k != "HEDGEROW_TEST_DATABASE_URL"}  # SQLite only
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--calls", "2000", "--repeat", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    [row] = json.loads(out.read_text())["results"]
    assert row["store"] == "sqlite" and row["calls"] == 2000
    assert all(row[key] > 0 for key in ("first_ms", "deep_page_ms", "keyset_rows_ms", "offset_rows_ms", "no_match_ms"))
