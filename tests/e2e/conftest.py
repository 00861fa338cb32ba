"""Fixtures of the end-to-end tests: a real ``hedgerow serve`` process on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.processes import stop_process
from tests.helpers import free_port


class ServeProcess:
    """A ``hedgerow serve`` subprocess; ``url`` is its root, ``db_url`` its store."""

    def __init__(self, db_url: str, workdir: Path, env: dict[str, str]) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "serve.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hedgerow.cli", "serve", "--db", db_url, "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env={**os.environ, **env},
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hedgerow serve exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"hedgerow serve did not come up: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    """``hedgerow serve`` on a fresh SQLite file, controller ticking every second."""
    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "1", "HEDGEROW_MIN_SAMPLES": "20", "HEDGEROW_MAX_STEP_DOWN": "0.9"}
    process = ServeProcess(f"sqlite+aiosqlite:///{tmp_path / 'e2e.db'}", tmp_path, env)
    try:
        yield process
    finally:
        process.stop()
