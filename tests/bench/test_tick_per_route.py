"""Smoke test of ``bench/tick_per_route.py``: it runs end to end and writes sound JSON (speed not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tick_per_route.py"


def test_tick_per_route_smoke(tmp_path: Path) -> None:
    out = tmp_path / "tick.json"
    env = {k: v for k, v in os.environ.items() if k != "HEDGEROW_TEST_DATABASE_URL"}  # SQLite only
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--routes", "3", "--calls", "60", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    [row] = json.loads(out.read_text())["results"]
    assert row["routes"] == 3 and row["calls_per_route"] == 60 and row["tick_ms_per_route"] > 0
