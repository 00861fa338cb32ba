"""Helpers for the subprocesses the end-to-end tests start."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], wait_s: float = 15.0) -> None:
    """Terminate ``proc`` if it still runs; kill it when it has not exited after ``wait_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
