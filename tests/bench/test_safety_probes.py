"""Smoke test of ``bench/safety_probes.py``: a ``--quick`` run of the cheap probes passes and writes sound JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "safety_probes.py"


def test_safety_probes_quick(tmp_path: Path) -> None:
    out = tmp_path / "safety.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(SCRIPT), "--quick", "--probe", "p3,p5,p1", "--pairs", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["benchmark"] == "safety_probes" and document["store"] == "sqlite" and document["quick"]
    rows = {row["probe"]: row for row in document["results"]}
    assert sorted(rows) == [
        "p1 serve pairs",
        "p1 upgrade pairs",
        "p3 RSS, 4 unauth uploads",
        "p3 RSS, one 1 MB body",
        "p5 forged writes",
        "p5 same-origin controls",
    ]
    for row in rows.values():
        assert row["store"] == "sqlite" and row["passed"] is True and row["figure"] and row["target"]
    assert rows["p1 upgrade pairs"]["pairs"] == 2 and rows["p1 upgrade pairs"]["half_migrated"] == 0
    assert rows["p3 RSS, one 1 MB body"]["status"] < 500
    assert rows["p3 RSS, 4 unauth uploads"]["answers"] == {"HTTP/1.1 401 Unauthorized": 4}
    assert rows["p5 forged writes"]["forged"] > 20 and rows["p5 forged writes"]["changed"] == []
    assert rows["p5 same-origin controls"]["controls"] == 6  # every write seen to change the state
    assert "| pass" in done.stdout and "FAIL" not in done.stdout
