"""A real ``hedgerow serve`` subprocess for the tests that need its sockets, signals and memory.

One way to start it, used from sync tests (:class:`ServeProcess`) and async tests
(:func:`running_serve`): ``hedgerow serve --db URL --port 0`` with ``HEDGEROW_*`` variables added
to the environment, its stdout and stderr written to files in its working directory (never a pipe
that nobody reads, which would stop a chatty server once the pipe is full), its address taken from
the line it prints once listening (``hedgerow: api listening on http://127.0.0.1:PORT ...``), so
no port is picked in advance and raced for. Both stop it with SIGTERM and fail the test when it
does not exit within 30 s (it is then killed).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServeProcess", "Served", "peak_rss_bytes", "rss_bytes", "running_serve"]

#: The line ``hedgerow serve`` prints once its socket listens.
ANNOUNCEMENT = re.compile(r"hedgerow: api listening on (http://127\.0\.0\.1:(\d+)) ")
#: Seconds a server may take to announce its address, and to stop after SIGTERM.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _command(database_url: str, prelude: str | None = None) -> list[str]:
    args = ["serve", "--db", database_url, "--port", "0"]
    if prelude is None:
        return [sys.executable, "-m", "hedgerow.cli", *args]
    return [sys.executable, "-c", f"{prelude}\nfrom hedgerow.cli import main\nmain()", *args]


def _log_paths(cwd: Path, stem: str = "serve") -> tuple[Path, Path]:
    return cwd / f"{stem}.out.log", cwd / f"{stem}.err.log"


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _announced(out_path: Path) -> re.Match[str] | None:
    return ANNOUNCEMENT.search(out_path.read_text(errors="replace")) if out_path.exists() else None


class ServeProcess:
    """A ``hedgerow serve`` subprocess for sync tests; ``url`` is its root, ``db_url`` its store.

    Args:
        db_url: the store's SQLAlchemy URL (``--db``).
        workdir: its working directory, where ``serve.out.log`` and ``serve.err.log`` go.
        env: ``HEDGEROW_*`` variables added to this process's environment.

    Raises:
        RuntimeError: the server exited, or did not announce its address within 60 s.
    """

    def __init__(self, db_url: str, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.db_url = db_url
        out_path, self.log = _log_paths(workdir)
        with open(out_path, "wb") as out, open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                _command(db_url),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env={**os.environ, **(env or {})},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        match = _announced(out_path)
        while match is None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            match = _announced(out_path)
        if match is None:
            self.stop()
            raise RuntimeError(f"hedgerow serve did not come up; stderr: {_tail(self.log)}")
        self.url, self.port = match.group(1), int(match.group(2))

    def stop(self) -> None:
        """SIGTERM, then kill after 30 s; safe to call twice.

        Raises:
            AssertionError: the server had to be killed.
        """
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("hedgerow serve did not stop on SIGTERM within 30 s") from None


@dataclass
class Served:
    """A running ``hedgerow serve`` started by :func:`running_serve`: its process, base url and port."""

    process: asyncio.subprocess.Process
    base: str
    port: int
    stderr_path: Path

    async def stderr_text(self) -> str:
        """Everything the process has written to stderr so far."""
        return self.stderr_path.read_text(errors="replace")


def _status_field(pid: int, name: str) -> int:
    """A ``VmXxx`` field of ``/proc/<pid>/status``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size so far (``VmHWM``), bytes."""
    return _status_field(pid, "VmHWM")


def rss_bytes(pid: int) -> int:
    """The process's resident set size now (``VmRSS``), bytes."""
    return _status_field(pid, "VmRSS")


@asynccontextmanager
async def running_serve(
    database_url: str, cwd: Path, *, prelude: str | None = None, logs: str = "serve", **env: str
) -> AsyncIterator[Served]:
    """Start ``hedgerow serve --port 0`` with ``HEDGEROW_*`` variables ``env``; SIGTERM (then kill) at exit.

    ``prelude``: Python run in the server process before the CLI starts (a benchmark's A/B
    switch), or None. ``logs``: the stem of its log files in ``cwd`` (two servers at once need
    two).

    Raises:
        AssertionError: the server did not announce its address within 60 s, or did not stop
            within 30 s of SIGTERM (it is then killed).
    """
    out_path, err_path = _log_paths(cwd, logs)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = await asyncio.create_subprocess_exec(
            *_command(database_url, prelude),
            stdout=out,
            stderr=err,
            stdin=asyncio.subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **env},
        )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        match = _announced(out_path)
        while match is None and process.returncode is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
            match = _announced(out_path)
        assert match, f"serve did not announce its address; stderr: {_tail(err_path)}"
        yield Served(process, match.group(1), int(match.group(2)), err_path)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
                raise AssertionError("hedgerow serve did not stop on SIGTERM within 30 s") from None
