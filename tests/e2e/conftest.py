"""Fixtures of the end-to-end tests: a real ``hedgerow serve`` process on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve_process import ServeProcess


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    """``hedgerow serve`` on a fresh SQLite file, controller ticking every second."""
    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "1", "HEDGEROW_MIN_SAMPLES": "20", "HEDGEROW_MAX_STEP_DOWN": "0.9"}
    process = ServeProcess(f"sqlite+aiosqlite:///{tmp_path / 'e2e.db'}", tmp_path, env)
    try:
        yield process
    finally:
        process.stop()
