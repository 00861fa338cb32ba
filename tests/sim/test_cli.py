"""``hedgerow replica``: starts, announces itself, serves; bad flags exit 2 with one line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import httpx
import pytest

HEDGEROW = shutil.which("hedgerow", path=os.path.dirname(sys.executable)) or "hedgerow"


def test_replica_command_serves_and_announces() -> None:
    proc = subprocess.Popen(
        [HEDGEROW, "replica", "--port", "0", "--name", "cli1", "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    try:
        line = proc.stdout.readline()
        m = re.match(r"replica cli1 listening on (http://127\.0\.0\.1:\d+/v1)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        resp = httpx.post(
            f"{m.group(1)}/chat/completions",
            timeout=10,
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--port", "0", "--time-scale", "0"], "--time-scale"),
        (["--port", "0", "--error-rate", "1.5"], "--error-rate"),
        (["--port", "0", "--tokens-per-chunk", "0"], "--tokens-per-chunk"),
        (["--port", "99999"], "--port"),
        (["--port", "0", "--perf-model", "/nonexistent/perf.csv"], "--perf-model"),
    ],
)
def test_bad_flags_exit_2(args: list[str], needle: str) -> None:
    proc = subprocess.run([HEDGEROW, "replica", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
