"""A real ``hedgerow serve`` subprocess for the tests that need its sockets, signals and memory."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Served", "peak_rss_bytes", "rss_bytes", "running_serve"]


@dataclass
class Served:
    """A running ``hedgerow serve``: its process, base url and port.

    Its stdout and stderr go to files in its working directory (never a pipe that nobody reads,
    which would stop a chatty server once the pipe is full); :meth:`stderr_text` reads the log.
    """

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
async def running_serve(database_url: str, cwd: Path, **env: str) -> AsyncIterator[Served]:
    """Start ``hedgerow serve --port 0`` with ``HEDGEROW_*`` variables ``env``; SIGTERM (then kill) at exit.

    Raises:
        AssertionError: the server did not announce its address within 60 s, or did not stop
            within 30 s of SIGTERM (it is then killed).
    """
    environment = {**os.environ, **env}
    out_path, err_path = cwd / "serve.out.log", cwd / "serve.err.log"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hedgerow.cli",
            "serve",
            "--db",
            database_url,
            "--port",
            "0",
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=environment,
        )
    try:
        pattern = re.compile(r"hedgerow: api listening on (http://127\.0\.0\.1:(\d+)) ")
        deadline = asyncio.get_running_loop().time() + 60
        match = None
        while match is None and process.returncode is None and asyncio.get_running_loop().time() < deadline:
            match = pattern.search(out_path.read_text(errors="replace"))
            if match is None:
                await asyncio.sleep(0.05)
        assert match, f"serve did not announce its address; stderr: {err_path.read_text(errors='replace')[-2000:]}"
        yield Served(process, match.group(1), int(match.group(2)), err_path)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()
                raise AssertionError("hedgerow serve did not stop on SIGTERM within 30 s") from None
