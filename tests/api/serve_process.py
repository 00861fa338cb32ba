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
    """A running ``hedgerow serve``: its process, base url and port."""

    process: asyncio.subprocess.Process
    base: str
    port: int


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
    """Start ``hedgerow serve --port 0`` with ``HEDGEROW_*`` variables ``env``; SIGTERM (then kill) at exit."""
    environment = {**os.environ, **env}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hedgerow.cli",
        "serve",
        "--db",
        database_url,
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=environment,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode()
        match = re.match(r"hedgerow: api listening on (http://127\.0\.0\.1:(\d+)) ", line)
        assert match, f"unexpected first line {line!r}; stderr: {(await process.stderr.read()).decode()[-2000:]}"
        yield Served(process, match.group(1), int(match.group(2)))
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()
