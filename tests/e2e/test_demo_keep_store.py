"""``hedgerow demo --keep-store PATH``: the run's store outlives the demo and ``serve`` opens it.

The demo's store used to live only in its temporary folder, deleted at the end, so a newcomer
never saw the console with data. The run below is the shortest the demo takes (4 s of load per
way), through real processes: the demo, then ``hedgerow serve`` on the kept file.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.serve_process import ServeProcess

DEMO = [sys.executable, "-m", "hedgerow.cli", "demo"]


def test_keep_store_refuses_an_existing_file_without_force(tmp_path: Path) -> None:
    """An existing PATH is refused at once (before any load), naming it; --force alone is refused."""
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"precious")
    done = subprocess.run([*DEMO, "--keep-store", str(taken)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--keep-store: {taken} exists; give --force to replace it" in done.stderr
    assert taken.read_bytes() == b"precious"
    folder = subprocess.run([*DEMO, "--keep-store", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert folder.returncode == 2 and "is a folder" in folder.stderr
    alone = subprocess.run([*DEMO, "--force"], capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and "--force: only with --keep-store" in alone.stderr


@pytest.mark.slow
def test_the_kept_store_opens_in_the_console(tmp_path: Path) -> None:
    kept = tmp_path / "kept.db"
    kept.write_bytes(b"old")  # replaced with --force
    args = [*DEMO, "--quick", "--duration", "4", "--rate", "10", "--report-dir", str(tmp_path / "report")]
    args += ["--keep-store", str(kept), "--force"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    command = f"hedgerow serve --db {shlex.quote(f'sqlite:///{kept}')}"
    assert command in done.stdout, done.stdout[-2000:]
    db_url = shlex.split(command)[-1]
    server = ServeProcess(db_url, tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        routes = httpx.get(f"{server.url}/v1/routes", timeout=60).json()
        names = {r["route"] for r in routes["routes"]}
        assert {"demo-none", "demo-fixed", "demo-adaptive"} <= names, routes
        page = httpx.get(f"{server.url}/ui/routes/demo-adaptive", params={"model": "llama2-70b"}, timeout=60)
        assert page.status_code == 200 and '<path class="series s-threshold" d="M' in page.text
        history = httpx.get(
            f"{server.url}/v1/routes/demo-adaptive/history", params={"model": "llama2-70b"}, timeout=60
        ).json()["history"]
        assert any(row["samples"] > 0 for row in history), history[:3]  # measured, not only the cold start
    finally:
        server.stop()
