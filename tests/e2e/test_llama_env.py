"""The cached llama environment's rules: plain pytest never builds, a dead holder's lock is free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e import llama_env
from tests.e2e.llama_env import LlamaEnvUnavailable, ensure_llama_env

ROOT = Path(__file__).resolve().parents[2]


def test_missing_env_without_build_flag_is_a_one_line_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDGEROW_LLAMA_VENV", str(tmp_path / "venv"))
    monkeypatch.delenv("HEDGEROW_LLAMA_ENV_BUILD", raising=False)
    started = time.monotonic()
    with pytest.raises(LlamaEnvUnavailable) as caught:
        ensure_llama_env()
    assert time.monotonic() - started < 5.0  # no build, no lock wait
    message = str(caught.value)
    assert "\n" not in message
    assert "HEDGEROW_LLAMA_ENV_BUILD=1" in message and "python tests/e2e/llama_env.py" in message
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_build_is_opt_in(value: str, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDGEROW_LLAMA_ENV_BUILD", value)
    assert llama_env.build_requested() is expected


def test_lock_of_a_killed_holder_is_taken_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "venv.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tests.e2e.llama_env import _locked\n"
            f"with _locked(__import__('pathlib').Path({str(lock)!r}), 1.0):\n"
            "    print('held', flush=True); time.sleep(600)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock.read_text().strip() == str(holder.pid)
        with pytest.raises(LlamaEnvUnavailable, match=f"process {holder.pid} held"), llama_env._locked(lock, 0.0):
            pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    started = time.monotonic()
    with llama_env._locked(lock, 0.0):
        assert lock.read_text().strip() == str(os.getpid())
    assert time.monotonic() - started < 1.0
